"""Regression evaluation: metrics, predicted-vs-true and trajectory plots, markdown report.

Domain-agnostic: works on vectors of true and predicted values. Domain scores (e.g. an
asymmetric cost) are computed by the caller and passed in ``extra``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import DataValidationError
from tasks.evaluate import new_figure, save_figure

log = logging.getLogger(__name__)


class RegressionReport(BaseModel):
    """Metrics of one regressor on one split."""

    model_config = ConfigDict(frozen=True)

    name: str
    split: str
    n: int
    rmse: float
    mae: float
    bias: float = Field(description="Mean of predicted - true (positive: predicts too high).")
    r2: float
    extra: dict[str, float] = Field(default_factory=dict, description="Caller-computed metrics.")

    def metrics(self) -> dict[str, float]:
        """Headline metrics keyed ``"<split>/<metric>"``."""
        s = self.split
        out = {f"{s}/rmse": self.rmse, f"{s}/mae": self.mae, f"{s}/bias": self.bias, f"{s}/r2": self.r2}
        out.update({f"{s}/{k}": v for k, v in self.extra.items()})
        return out


def _check(y_true: np.ndarray, y_pred: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y_true, dtype="float64").ravel()
    p = np.asarray(y_pred, dtype="float64").ravel()
    if len(y) != len(p):
        raise DataValidationError(f"y_true has {len(y)} values and y_pred {len(p)}", source=what)
    if len(y) == 0:
        raise DataValidationError("nothing to evaluate (0 samples)", source=what)
    bad = ~(np.isfinite(y) & np.isfinite(p))
    if bad.any():
        raise DataValidationError(
            f"{int(bad.sum())} non-finite true or predicted values", source=what, rows=np.flatnonzero(bad)[:5].tolist()
        )
    return y, p


def evaluate_regression(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    *,
    name: str,
    split: str = "test",
    extra: Mapping[str, float] | None = None,
) -> RegressionReport:
    """RMSE, MAE, bias and R² of predictions (plus caller-given ``extra`` metrics)."""
    y, p = _check(y_true, y_pred, f"evaluate_regression({name}/{split})")
    err = p - y
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    report = RegressionReport(
        name=name,
        split=split,
        n=len(y),
        rmse=float(np.sqrt(np.mean(err**2))),
        mae=float(np.mean(np.abs(err))),
        bias=float(np.mean(err)),
        r2=float(1 - np.sum(err**2) / ss_tot) if ss_tot > 0 else float("nan"),
        extra={k: float(v) for k, v in (extra or {}).items()},
    )
    log.info("%s/%s: n=%d rmse=%.3f mae=%.3f", name, split, report.n, report.rmse, report.mae)
    return report


def plot_pred_vs_true(
    series: Sequence[tuple[str, np.ndarray, np.ndarray]], path: Path, *, title: str = "predicted vs true"
) -> Path:
    """Scatter of predicted against true values, one colour per model, with the diagonal."""
    fig = new_figure()
    ax = fig.add_subplot()
    hi = 1.0
    for label, y, p in series:
        y, p = _check(y, p, f"plot_pred_vs_true({label})")
        ax.scatter(y, p, s=10, alpha=0.7, label=label)
        hi = max(hi, float(y.max()), float(p.max()))
    ax.plot([0, hi], [0, hi], ls="--", lw=1, color="grey")
    ax.set(xlabel="true", ylabel="predicted", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_trajectories(
    trajectories: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], path: Path, *, xlabel: str = "step"
) -> Path:
    """True (dashed) and predicted (solid) values over ``x`` for a few groups (e.g. units)."""
    fig = new_figure()
    ax = fig.add_subplot()
    for label, (x, y, p) in trajectories.items():
        (line,) = ax.plot(x, p, lw=1.2, label=label)
        ax.plot(x, y, ls="--", lw=1, color=line.get_color())
    ax.set(xlabel=xlabel, ylabel="value (dashed: true)", title="trajectories")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def render_regression_report(
    reports: Sequence[RegressionReport], *, title: str, images: Sequence[Path] = ()
) -> str:
    """Markdown table of regression reports (one row each) plus image links."""
    extras = sorted({k for r in reports for k in r.extra})
    head = ["model", "split", "n", "RMSE", "MAE", "bias", "R²", *extras]
    lines = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in reports:
        cells = [r.name, r.split, str(r.n), f"{r.rmse:.3f}", f"{r.mae:.3f}", f"{r.bias:+.3f}", f"{r.r2:.3f}"]
        cells += [f"{r.extra[k]:.4g}" if k in r.extra else "—" for k in extras]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + [f"![{Path(p).stem}]({Path(p).as_posix()})" for p in images]
    return "\n".join(lines) + "\n"

