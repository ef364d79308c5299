"""Live training curves: per-epoch loss, validation metric, learning rate and gradient norm.

:func:`make_curve_recorder` builds a Lightning callback that, after every epoch,

- appends a row to ``curves.csv`` beside the checkpoints (rows of a resumed run are kept
  up to the resumed epoch, so the file has one row per epoch of the whole training) and
  redraws ``curves.png`` there;
- inside a Prefect flow or task run, publishes ONE markdown artifact per training
  (``train-curves-<run key>``: the chart as an embedded PNG, which Prefect's UI renders, and
  the table of rows so far), created at the first epoch and updated in place at each next
  one, and moves a progress artifact (:mod:`tasks.progress`), so the UI shows the curves
  while the training runs, not only after it ends; when the fit ends its last update says so
  ("Done: N epoch(s) trained"), so the artifact of a finished training never reads "so far".

The callback costs little per step: the training loss is summed as a tensor (no host sync per
step) and the gradient norm (before clipping) is measured on the first step of each epoch and
every ``grad_norm_every``-th step after it.
"""

from __future__ import annotations

import base64
import csv
import io
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from infra.store import atomic_path
from tasks.progress import Progress, ProgressArtifact, in_prefect_run

log = logging.getLogger(__name__)

CURVES_FILE = "curves.csv"
CURVES_PNG = "curves.png"
#: Columns of ``curves.csv``, in order (the monitored metric is added when it is not ``val/loss``).
BASE_COLUMNS = ("epoch", "train/loss", "val/loss", "lr", "grad_norm", "epoch_seconds", "samples_per_s")


def curves_artifact_key(run_key: str) -> str:
    """The Prefect artifact key of a run's curves (lowercase letters, digits and dashes)."""
    return "train-curves-" + (re.sub(r"[^a-z0-9]+", "-", run_key.lower()).strip("-") or "run")


def curve_columns(monitor: str) -> list[str]:
    """The CSV columns for a training that monitors ``monitor``."""
    columns = list(BASE_COLUMNS)
    if monitor not in columns:
        columns.insert(3, monitor)
    return columns


def read_curves(path: Path) -> list[dict[str, float | None]]:
    """Rows of a ``curves.csv`` (empty cells as None)."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return [{k: (float(v) if v not in ("", None) else None) for k, v in row.items()} for row in csv.DictReader(handle)]


def _scalar(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class CurveRecorder(Callback):
    """Per-epoch curves to CSV and (inside a Prefect run) to the UI; see the module docstring."""

    def __init__(self, ckpt_dir: Path, run_key: str, monitor: str, grad_norm_every: int = 10,
                 publish: bool | None = None) -> None:
        self.path = Path(ckpt_dir) / CURVES_FILE
        self.run_key = run_key
        self.monitor = monitor
        self.columns = curve_columns(monitor)
        self.grad_norm_every = max(1, grad_norm_every)
        self.publish = publish
        self.rows: list[dict[str, float | None]] = []
        self.artifact_key = curves_artifact_key(run_key)
        self.artifact_id: Any = None  # the one curves artifact of this training, once created
        self.progress: Progress | None = None
        self._png: bytes | None = None  # the last chart published
        self._reset_epoch()

    # -- accumulation (cheap: tensors stay on the device until the epoch ends)
    def _reset_epoch(self) -> None:
        self._loss_sum: Any = 0.0
        self._loss_n = 0
        self._norm_sum: Any = 0.0
        self._norm_n = 0
        self._steps = 0
        self._samples = 0
        self._lr: float | None = None
        self._t0 = time.perf_counter()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        start = trainer.current_epoch
        self.rows = [r for r in read_curves(self.path) if r.get("epoch") is not None and r["epoch"] < start]
        if self.publish is None:
            self.publish = in_prefect_run()
        if self.publish and trainer.is_global_zero:
            # the console line per epoch is the train task's (tasks.train.epoch_progress): artifact only here
            self.progress = Progress(max(1, trainer.max_epochs or 1), f"train {self.run_key}", "epochs",
                                     publish=ProgressArtifact(f"Epochs of {self.run_key} done (% of max_epochs)"),
                                     live=False, every_s=math.inf, every_pct=math.inf, publish_every_s=0.0,
                                     logger=_QUIET)
            self.progress.start()
            self.progress.advance(len(self.rows))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.progress is not None:
            self.progress.close()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """The artifact's last state: done (the per-epoch updates said "so far")."""
        if self.publish and trainer.is_global_zero and self.artifact_id is not None:
            early = trainer.should_stop and trainer.max_epochs is not None and len(self.rows) < trainer.max_epochs
            self._publish_curves(self._png, status=f"Done: {len(self.rows)} epoch(s) trained"
                                 + (" (stopped early)." if early else "."))

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._reset_epoch()
        # the rate this epoch trains with (an epoch-wise scheduler steps before the epoch-end hooks)
        self._lr = _scalar(trainer.optimizers[0].param_groups[0].get("lr")) if trainer.optimizers else None

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        step, self._steps = self._steps, self._steps + 1
        if step % self.grad_norm_every:  # the first step of each epoch, then every n-th
            return
        import torch

        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads:
            self._norm_sum = self._norm_sum + torch.nn.utils.get_total_norm(grads).detach()
            self._norm_n += 1

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            self._loss_sum = self._loss_sum + loss.detach()
            self._loss_n += 1
        first = batch[0] if isinstance(batch, (list, tuple)) else batch
        if isinstance(first, dict):
            first = next(iter(first.values()))
        self._samples += int(getattr(first, "shape", [1])[0])

    # -- one row per epoch (validation has run before this hook in Lightning 2)
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        seconds = time.perf_counter() - self._t0
        metrics = trainer.callback_metrics
        row: dict[str, float | None] = {
            "epoch": float(trainer.current_epoch),
            "train/loss": _scalar(self._loss_sum / self._loss_n) if self._loss_n else _scalar(metrics.get("train/loss")),
            "val/loss": _scalar(metrics.get("val/loss")),
            "lr": self._lr,
            "grad_norm": _scalar(self._norm_sum / self._norm_n) if self._norm_n else None,
            "epoch_seconds": round(seconds, 3),
            "samples_per_s": round(self._samples * trainer.world_size / seconds, 1) if seconds > 0 else None,
        }
        if self.monitor not in row:
            row[self.monitor] = _scalar(metrics.get(self.monitor))
        self.rows.append(row)
        if not trainer.is_global_zero:
            return
        self._write_csv()
        png = self._write_png()
        if self.publish:
            self._png = png
            self._publish_curves(png)
            if self.progress is not None:
                self.progress.advance()

    def _write_csv(self) -> None:
        with atomic_path(self.path) as tmp, tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.columns, extrasaction="ignore")
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: ("" if row.get(k) is None else _fmt(k, row[k])) for k in self.columns})

    def _write_png(self) -> bytes | None:
        try:
            png = plot_curves(self.rows, self.monitor)
        except Exception as exc:  # noqa: BLE001 - a chart is a convenience: the CSV holds the curves
            log.warning("could not draw the training curves: %s", exc)
            return None
        with atomic_path(self.path.with_name(CURVES_PNG)) as tmp:
            tmp.write_bytes(png)
        return png

    # -- Prefect UI (never fails the training)
    def _publish_curves(self, png: bytes | None, status: str | None = None) -> None:
        from prefect.artifacts import create_markdown_artifact

        markdown = render_curves(self.rows, self.columns, self.run_key, png, status)
        try:
            if self.artifact_id is None:
                self.artifact_id = create_markdown_artifact(
                    markdown=markdown, key=self.artifact_key,
                    description=f"Training curves of {self.run_key}: chart and one row per epoch, updated while it trains.",
                )
            else:
                update_artifact_data(self.artifact_id, markdown)
        except Exception as exc:  # noqa: BLE001 - the UI is a convenience: the CSV holds the curves
            log.warning("could not publish the training curves: %s", exc)


#: The training's progress artifact logs nothing (the train task logs each epoch).
_QUIET = logging.getLogger(__name__ + ".progress")
_QUIET.propagate = False
_QUIET.addHandler(logging.NullHandler())


def update_artifact_data(artifact_id: Any, data: Any) -> None:
    """Replace the data of an existing artifact (its key and id stay: the UI shows one artifact)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactUpdate

    with get_client(sync_client=True) as client:
        client.update_artifact(artifact_id=artifact_id, artifact=ArtifactUpdate(data=data))


def plot_curves(rows: list[dict[str, float | None]], monitor: str) -> bytes:
    """A PNG: training and validation loss per epoch (left) and the monitored metric (right)."""
    from tasks.evaluate import new_figure

    epochs = [int(r["epoch"] or 0) for r in rows]  # Lightning's epoch, from 0, as in the table and curves.csv
    metric = monitor if monitor != "val/loss" else None
    fig = new_figure((8.0, 3.2) if metric else (4.5, 3.2))
    axes = fig.subplots(1, 2 if metric else 1, squeeze=False)[0]
    for name in ("train/loss", "val/loss"):
        points = [(e, r.get(name)) for e, r in zip(epochs, rows, strict=True) if r.get(name) is not None]
        if points:
            axes[0].plot(*zip(*points, strict=True), marker="o", ms=3, lw=1.5, label=name)
    axes[0].set(xlabel="epoch", ylabel="loss", title="loss")
    if metric:
        points = [(e, r.get(metric)) for e, r in zip(epochs, rows, strict=True) if r.get(metric) is not None]
        if points:
            axes[1].plot(*zip(*points, strict=True), marker="o", ms=3, lw=1.5, color="tab:green", label=metric)
        axes[1].set(xlabel="epoch", ylabel=metric, title=metric)
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def render_curves(rows: list[dict[str, float | None]], columns: list[str], run_key: str, png: bytes | None,
                  status: str | None = None) -> str:
    """Markdown of the curves artifact: the status line (default: ``N epoch(s) so far.``), the
    chart (an embedded PNG) and the table, one row per epoch."""
    lines = [f"## Training curves: {run_key}", "", status or f"{len(rows)} epoch(s) so far.", ""]
    if png:
        lines += [f"![training curves](data:image/png;base64,{base64.b64encode(png).decode('ascii')})", ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = ["" if r.get(k) is None else str(_fmt(k, r[k])) for k in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_curves_table(markdown: str) -> list[dict[str, float | None]]:
    """The rows of a curves artifact's table (tests and tools read the artifact back with it)."""
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    if len(table) < 2:
        return []
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = []
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append({k: (float(v) if v else None) for k, v in zip(header, cells, strict=True)})
    return rows


def _fmt(column: str, value: Any) -> Any:
    if column == "epoch":
        return int(value)
    return float(f"{value:.6g}") if isinstance(value, float) else value


def make_curve_recorder(ckpt_dir: Path, run_key: str, monitor: str, **kwargs: Any) -> CurveRecorder:
    """The curves callback of one training (see :class:`CurveRecorder`)."""
    return CurveRecorder(ckpt_dir, run_key, monitor, **kwargs)
