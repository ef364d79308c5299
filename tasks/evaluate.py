"""Binary classification evaluation: metrics, threshold choice, curves, report.

Domain-agnostic: everything here works on a vector of 0/1 labels and a vector
of scores (higher = more likely positive). A sample is predicted positive when
``score >= threshold``.

Plain functions do the work and are unit-testable without Prefect; the
``*_task`` objects at the bottom are thin Prefect wrappers over them.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from prefect import task
from prefect.cache_policies import NONE
from prefect.context import FlowRunContext, TaskRunContext
from pydantic import BaseModel, ConfigDict

from infra.errors import DataValidationError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from numpy.typing import ArrayLike, NDArray

logger = logging.getLogger(__name__)

_FIG_SIZE = (5.0, 4.0)
_FIG_DPI = 80


class EvalReport(BaseModel):
    """Metrics of one binary classifier on one split.

    Attributes:
        name: Model or candidate name, e.g. ``"sequence"`` or ``"baseline"``.
        split: Split the metrics were computed on, e.g. ``"test"``.
        n: Number of samples.
        n_positive: Number of positive samples.
        roc_auc: Area under the ROC curve.
        pr_auc: Average precision (the step-wise area under the PR curve).
        fpr_target: False-positive-rate bound used for ``recall_at_fpr``.
        recall_at_fpr: Highest recall reachable with FPR <= ``fpr_target``.
        threshold: Decision threshold (``score >= threshold`` is positive)
            used for precision, recall, F1 and the confusion matrix.
        precision: Precision at ``threshold``.
        recall: Recall at ``threshold``.
        f1: F1 score at ``threshold``.
        confusion: ``[[tn, fp], [fn, tp]]`` at ``threshold``.
        roc_png: Path of the saved ROC curve image, if any.
        pr_png: Path of the saved precision-recall curve image, if any.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    split: str
    n: int
    n_positive: int
    roc_auc: float
    pr_auc: float
    fpr_target: float
    recall_at_fpr: float
    threshold: float
    precision: float
    recall: float
    f1: float
    confusion: list[list[int]]
    roc_png: str | None = None
    pr_png: str | None = None

    def metrics(self) -> dict[str, float]:
        """Return the headline metrics keyed ``"<split>/<metric>"``.

        Returns:
            A flat dict suitable for metric loggers, e.g. ``{"test/auprc": 0.41}``.
        """
        s = self.split
        return {
            f"{s}/roc_auc": self.roc_auc,
            f"{s}/auprc": self.pr_auc,
            f"{s}/recall_at_fpr": self.recall_at_fpr,
            f"{s}/precision": self.precision,
            f"{s}/recall": self.recall,
            f"{s}/f1": self.f1,
        }


# --------------------------------------------------------------------------- #
# Validation
# --------------------------------------------------------------------------- #


def _validate(
    y_true: ArrayLike, y_score: ArrayLike, *, what: str = "inputs"
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Check labels/scores and return them as 1-D int and float arrays.

    Raises:
        DataValidationError: (a ``ValueError``) if shapes differ, scores are
            not finite, labels are not in {0, 1}, or only one class is present.
    """
    y = np.asarray(y_true)
    s = np.asarray(y_score)
    if y.ndim != 1 or s.ndim != 1:
        raise DataValidationError(
            f"y_true and y_score must be 1-D, got shapes {y.shape} and {s.shape}; "
            "for an (n, 2) probability matrix pass proba[:, 1].",
            source=what,
        )
    if len(y) != len(s):
        raise DataValidationError(
            f"length mismatch, y_true has {len(y)} items and y_score has {len(s)}; "
            "pass labels and scores for the same samples.",
            source=what,
        )
    if len(y) == 0:
        raise DataValidationError("y_true and y_score are empty.", source=what)
    try:
        s = s.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise DataValidationError(
            f"y_score must be numeric ({exc}).", source=what
        ) from exc
    bad = ~np.isfinite(s)
    if bad.any():
        raise DataValidationError(
            f"y_score has {int(bad.sum())} non-finite values (NaN/inf); drop or "
            "impute them before evaluating.",
            source=what,
            column="y_score",
            rows=np.flatnonzero(bad)[:5].tolist(),
        )
    try:
        labels = set(np.unique(y).tolist())
    except TypeError as exc:
        raise DataValidationError(
            f"y_true must be 0/1 labels ({exc}).", source=what
        ) from exc
    if not labels <= {0, 1}:
        shown = sorted(map(repr, labels - {0, 1}))[:5]
        raise DataValidationError(
            f"y_true must contain only 0 and 1 (or bools), found {', '.join(shown)}; "
            "encode the positive class as 1.",
            source=what,
            column="y_true",
        )
    if len(labels) < 2:
        only = int(next(iter(labels)))
        raise DataValidationError(
            f"y_true contains only class {only} ({len(y)} samples); ROC and PR "
            "metrics need both classes, use a larger or stratified split.",
            source=what,
            column="y_true",
        )
    return y.astype(np.int64), s


# --------------------------------------------------------------------------- #
# Thresholds and metrics
# --------------------------------------------------------------------------- #


def _fpr_operating_point(
    y: NDArray[np.int64], s: NDArray[np.float64], fpr_target: float
) -> tuple[float, float]:
    """Return ``(threshold, recall)`` of the best point with FPR <= fpr_target.

    Among the ROC points whose FPR is within the bound, picks the one with the
    highest recall, i.e. the lowest threshold that still respects the bound.
    If no finite threshold respects it, the threshold is just above the
    maximum score (nothing predicted positive) and the recall is 0.
    """
    from sklearn.metrics import roc_curve

    if not 0.0 <= fpr_target <= 1.0:
        raise ValueError(f"fpr_target must be in [0, 1], got {fpr_target}.")
    fpr, tpr, thresholds = roc_curve(y, s, drop_intermediate=False)
    idx = int(np.flatnonzero(fpr <= fpr_target)[-1])  # fpr is non-decreasing
    threshold = float(thresholds[idx])
    if not np.isfinite(threshold):
        threshold = float(np.nextafter(s.max(), np.inf))
    return threshold, float(tpr[idx])


def choose_threshold(
    y_true: ArrayLike,
    y_score: ArrayLike,
    *,
    method: Literal["f1", "fpr"] = "f1",
    fpr_target: float = 0.01,
) -> float:
    """Choose a decision threshold from labelled scores (e.g. a validation split).

    Args:
        y_true: 0/1 labels.
        y_score: Scores, higher means more likely positive.
        method: ``"f1"`` picks the threshold maximising F1; ``"fpr"`` picks the
            lowest threshold whose false positive rate is <= ``fpr_target``
            (the highest recall within the FPR budget).
        fpr_target: FPR bound for ``method="fpr"``.

    Returns:
        The threshold; predict positive when ``score >= threshold``.

    Raises:
        DataValidationError: If the labels or scores are invalid.
        ValueError: If ``method`` or ``fpr_target`` is invalid.
    """
    y, s = _validate(y_true, y_score, what="choose_threshold")
    if method == "fpr":
        return _fpr_operating_point(y, s, fpr_target)[0]
    if method != "f1":
        raise ValueError(f"method must be 'f1' or 'fpr', got {method!r}.")

    from sklearn.metrics import precision_recall_curve

    precision, recall, thresholds = precision_recall_curve(y, s)
    # The last PR point (precision=1, recall=0) has no threshold.
    p, r = precision[:-1], recall[:-1]
    denom = p + r
    f1 = np.divide(2 * p * r, denom, out=np.zeros_like(denom), where=denom > 0)
    return float(thresholds[int(np.argmax(f1))])


def evaluate_binary(
    y_true: ArrayLike,
    y_score: ArrayLike,
    *,
    name: str,
    split: str = "test",
    threshold: float | None = None,
    fpr_target: float = 0.01,
    out_dir: Path | None = None,
) -> EvalReport:
    """Compute ranking and thresholded metrics of one binary classifier.

    Args:
        y_true: 0/1 labels.
        y_score: Scores, higher means more likely positive.
        name: Model or candidate name, used in the report and file names.
        split: Split name, used in metric keys and file names.
        threshold: Decision threshold (``score >= threshold`` is positive).
            Choose it on a validation split with :func:`choose_threshold` and
            pass it here. If ``None``, the max-F1 threshold is chosen on these
            very labels, which makes precision/recall/F1 optimistic: fine for
            a quick look, not for a reported test number.
        fpr_target: FPR bound for ``recall_at_fpr``.
        out_dir: If given, ROC and PR curve PNGs are written there as
            ``{name}_{split}_roc.png`` and ``{name}_{split}_pr.png``.

    Returns:
        The frozen :class:`EvalReport`.

    Raises:
        DataValidationError: If the labels or scores are invalid.
        ValueError: If ``threshold`` is not finite or ``fpr_target`` is out of
            [0, 1].
    """
    from sklearn.metrics import average_precision_score, roc_auc_score

    y, s = _validate(y_true, y_score, what=f"evaluate_binary({name}/{split})")
    if threshold is None:
        threshold = choose_threshold(y, s, method="f1")
        logger.info(
            "%s/%s: no threshold given, using max-F1 threshold %.6g chosen on "
            "the same labels (optimistic)",
            name,
            split,
            threshold,
        )
    elif not np.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold}.")

    _, recall_at_fpr = _fpr_operating_point(y, s, fpr_target)

    pred = s >= threshold
    tp = int(np.sum(pred & (y == 1)))
    fp = int(np.sum(pred & (y == 0)))
    fn = int(np.sum(~pred & (y == 1)))
    tn = int(np.sum(~pred & (y == 0)))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0

    roc_png = pr_png = None
    if out_dir is not None:
        stem = _safe_filename(f"{name}_{split}")
        roc_path, pr_path = _save_curves(
            [(name, y, s)],
            title=f"{name} ({split})",
            roc_path=Path(out_dir) / f"{stem}_roc.png",
            pr_path=Path(out_dir) / f"{stem}_pr.png",
        )
        roc_png, pr_png = str(roc_path), str(pr_path)

    report = EvalReport(
        name=name,
        split=split,
        n=len(y),
        n_positive=int(y.sum()),
        roc_auc=float(roc_auc_score(y, s)),
        pr_auc=float(average_precision_score(y, s)),
        fpr_target=float(fpr_target),
        recall_at_fpr=recall_at_fpr,
        threshold=float(threshold),
        precision=float(precision),
        recall=float(recall),
        f1=float(f1),
        confusion=[[tn, fp], [fn, tp]],
        roc_png=roc_png,
        pr_png=pr_png,
    )
    logger.info(
        "%s/%s: n=%d pos=%d roc_auc=%.4f auprc=%.4f recall@fpr<=%g=%.4f f1=%.4f",
        name,
        split,
        report.n,
        report.n_positive,
        report.roc_auc,
        report.pr_auc,
        fpr_target,
        report.recall_at_fpr,
        report.f1,
    )
    return report


# --------------------------------------------------------------------------- #
# Plots
# --------------------------------------------------------------------------- #


def _safe_filename(stem: str) -> str:
    """Replace characters that are awkward in file names with ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("_") or "model"


def new_figure(size: tuple[float, float] = _FIG_SIZE) -> Figure:
    """Create a figure bound to the Agg canvas, without touching pyplot state (thread-safe)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=_FIG_DPI)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: Path) -> Path:
    """Lay out and write ``fig`` as PNG, creating the folder."""
    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _draw_roc(ax: Axes, curves: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> None:
    from sklearn.metrics import roc_auc_score, roc_curve

    for label, y, s in curves:
        fpr, tpr, _ = roc_curve(y, s)
        ax.plot(fpr, tpr, lw=1.5, label=f"{label} (AUC={roc_auc_score(y, s):.3f})")
    ax.plot([0, 1], [0, 1], ls="--", lw=1, color="grey", label="no skill")
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1.02),
        xlabel="False positive rate",
        ylabel="True positive rate",
    )


def _draw_pr(ax: Axes, curves: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> None:
    from sklearn.metrics import average_precision_score, precision_recall_curve

    prevalences = [float(np.mean(y)) for _, y, _ in curves]
    same_prevalence = np.allclose(prevalences, prevalences[0])
    for (label, y, s), prevalence in zip(curves, prevalences, strict=True):
        precision, recall, _ = precision_recall_curve(y, s)
        (line,) = ax.step(
            recall,
            precision,
            where="post",
            lw=1.5,
            label=f"{label} (AP={average_precision_score(y, s):.3f})",
        )
        if not same_prevalence:
            ax.axhline(prevalence, ls=":", lw=1, color=line.get_color())
    if same_prevalence:
        ax.axhline(
            prevalences[0],
            ls="--",
            lw=1,
            color="grey",
            label=f"no skill (prevalence={prevalences[0]:.4f})",
        )
    ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="Recall", ylabel="Precision")


def _save_curves(
    curves: Sequence[tuple[str, np.ndarray, np.ndarray]],
    *,
    title: str,
    roc_path: Path,
    pr_path: Path,
) -> tuple[Path, Path]:
    """Draw and save one ROC and one PR figure over the given curves."""
    roc_path.parent.mkdir(parents=True, exist_ok=True)
    pr_path.parent.mkdir(parents=True, exist_ok=True)
    for path, draw, kind, loc in (
        (roc_path, _draw_roc, "ROC", "lower right"),
        (pr_path, _draw_pr, "Precision-recall", "upper right"),
    ):
        fig = new_figure()
        ax = fig.add_subplot()
        draw(ax, curves)
        ax.set_title(f"{kind}: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc=loc, fontsize=7)
        save_figure(fig, path)
    logger.info("Saved curves to %s and %s", roc_path, pr_path)
    return roc_path, pr_path


def plot_comparison(
    curves: Sequence[tuple[str, ArrayLike, ArrayLike]],
    split: str,
    out_dir: Path,
    *,
    stem: str = "comparison",
) -> tuple[Path, Path]:
    """Overlay several models on one ROC and one PR figure.

    Args:
        curves: ``(name, y_true, y_score)`` per model, typically all on the
            same split (e.g. sequence model vs baseline on test).
        split: Split name, used in the titles and file names.
        out_dir: Folder for the images (created if missing).
        stem: File name prefix; files are ``{stem}_{split}_roc.png`` and
            ``{stem}_{split}_pr.png``.

    Returns:
        ``(roc_png, pr_png)`` paths.

    Raises:
        DataValidationError: If a curve's labels or scores are invalid.
        ValueError: If ``curves`` is empty.
    """
    if not curves:
        raise ValueError("plot_comparison needs at least one (name, y_true, y_score).")
    checked = [
        (name, *_validate(y, s, what=f"plot_comparison({name})"))
        for name, y, s in curves
    ]
    base = _safe_filename(f"{stem}_{split}")
    return _save_curves(
        checked,
        title=f"{split} split",
        roc_path=Path(out_dir) / f"{base}_roc.png",
        pr_path=Path(out_dir) / f"{base}_pr.png",
    )


# --------------------------------------------------------------------------- #
# Report rendering and publishing
# --------------------------------------------------------------------------- #


def _md_cell(text: str) -> str:
    return str(text).replace("|", r"\|").replace("\n", " ")


def render_eval_report(
    reports: Sequence[EvalReport],
    title: str,
    images: Sequence[Path] = (),
) -> str:
    """Render reports side by side as a markdown table, with inline images.

    Args:
        reports: One report per column (e.g. sequence model and baseline).
        title: Level-2 heading of the document.
        images: PNG files to embed as base64 data URIs, each followed by its
            path. Keep them small (the module saves at 5x4 in, 80 dpi).

    Returns:
        The markdown document.
    """
    lines = [f"## {title}", ""]
    if reports:
        splits = {r.split for r in reports}
        headers = [
            r.name if len(splits) == 1 else f"{r.name} ({r.split})" for r in reports
        ]
        rows: list[tuple[str, list[str]]] = [
            ("split", [r.split for r in reports]),
            ("n", [str(r.n) for r in reports]),
            ("positives", [str(r.n_positive) for r in reports]),
            ("prevalence", [f"{r.n_positive / r.n:.4f}" for r in reports]),
            ("ROC AUC", [f"{r.roc_auc:.4f}" for r in reports]),
            ("AUPRC (average precision)", [f"{r.pr_auc:.4f}" for r in reports]),
            ("FPR target", [f"{r.fpr_target:.4f}" for r in reports]),
            ("recall @ FPR target", [f"{r.recall_at_fpr:.4f}" for r in reports]),
            ("threshold", [f"{r.threshold:.4g}" for r in reports]),
            ("precision", [f"{r.precision:.4f}" for r in reports]),
            ("recall", [f"{r.recall:.4f}" for r in reports]),
            ("F1", [f"{r.f1:.4f}" for r in reports]),
            ("TN", [str(r.confusion[0][0]) for r in reports]),
            ("FP", [str(r.confusion[0][1]) for r in reports]),
            ("FN", [str(r.confusion[1][0]) for r in reports]),
            ("TP", [str(r.confusion[1][1]) for r in reports]),
        ]
        lines.append("| metric | " + " | ".join(_md_cell(h) for h in headers) + " |")
        lines.append("|---|" + "---:|" * len(reports))
        for label, values in rows:
            lines.append(
                f"| {label} | " + " | ".join(_md_cell(v) for v in values) + " |"
            )
        lines.append("")
        lines.append(
            "Precision, recall, F1 and counts are at each model's threshold "
            "(`score >= threshold` is positive)."
        )
    else:
        lines.append("_No reports._")

    for image in images:
        path = Path(image)
        encoded = base64.b64encode(path.read_bytes()).decode("ascii")
        lines += [
            "",
            f"![{_md_cell(path.stem)}](data:image/png;base64,{encoded})",
            "",
            f"`{path}`",
        ]
    return "\n".join(lines) + "\n"


def artifact_key(raw: str) -> str:
    """Turn any string into a valid Prefect artifact key.

    Prefect keys may contain only lowercase letters, digits and dashes.

    Args:
        raw: Desired key, e.g. ``"Fraud_Eval/test"``.

    Returns:
        The sanitised key, e.g. ``"fraud-eval-test"``.

    Raises:
        ValueError: If nothing usable is left.
    """
    key = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")
    if not key:
        raise ValueError(f"artifact key {raw!r} has no letters or digits.")
    return key


def publish_eval_report(markdown: str, key: str, description: str) -> None:
    """Publish a markdown report as a Prefect artifact when inside a run.

    Outside a flow or task run it only logs that it skipped, so plain scripts
    and unit tests never talk to a Prefect API.

    Args:
        markdown: Report text, e.g. from :func:`render_eval_report`.
        key: Artifact key; sanitised with :func:`artifact_key`.
        description: Short description shown in the Prefect UI.
    """
    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        logger.info(
            "Not in a Prefect flow or task run; skipped publishing artifact %r", key
        )
        return

    from prefect.artifacts import create_markdown_artifact

    clean = artifact_key(key)
    create_markdown_artifact(markdown=markdown, key=clean, description=description)
    logger.info("Published markdown artifact %r (%d chars)", clean, len(markdown))


evaluate_binary_task = task(name="evaluate-binary", cache_policy=NONE)(evaluate_binary)
publish_eval_report_task = task(name="publish-eval-report", cache_policy=NONE)(
    publish_eval_report
)
