"""Live training curves: per-epoch loss, validation metric, learning rate and gradient norm.

:func:`make_curve_recorder` builds a Lightning callback that, after every epoch,

- appends a row to ``curves.csv`` beside the checkpoints (rows of a resumed run are kept
  up to the resumed epoch, so the file has one row per epoch of the whole training);
- inside a Prefect flow or task run, publishes the rows so far as a table artifact
  (``train-curves-<run key>``, a new version per epoch) and moves a progress artifact, so the
  UI shows the curves while the training runs, not only after it ends.

The callback costs little per step: the training loss is summed as a tensor (no host sync per
step) and the gradient norm (before clipping) is measured on the first step of each epoch and
every ``grad_norm_every``-th step after it.
"""

from __future__ import annotations

import csv
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from infra.store import atomic_path

log = logging.getLogger(__name__)

CURVES_FILE = "curves.csv"
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


def _in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


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
        self.progress_id: Any = None
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
            self.publish = _in_prefect_run()
        if self.publish and trainer.is_global_zero:
            self._publish_progress(trainer, create=True)

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
        if self.publish:
            self._publish_table()
            self._publish_progress(trainer)

    def _write_csv(self) -> None:
        with atomic_path(self.path) as tmp, tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.columns, extrasaction="ignore")
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: ("" if row.get(k) is None else _fmt(k, row[k])) for k in self.columns})

    # -- Prefect UI (never fails the training)
    def _publish_table(self) -> None:
        from prefect.artifacts import create_table_artifact

        table = [{k: (_fmt(k, r.get(k)) if r.get(k) is not None else None) for k in self.columns} for r in self.rows]
        try:
            create_table_artifact(
                table=table,
                key=self.artifact_key,
                description=f"Training curves of {self.run_key}: one row per epoch, updated while it trains.",
            )
        except Exception as exc:  # noqa: BLE001 - the UI is a convenience: the CSV holds the curves
            log.warning("could not publish the training curves: %s", exc)

    def _publish_progress(self, trainer: Any, create: bool = False) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        done = 100.0 * (len(self.rows) and (int(self.rows[-1]["epoch"] or 0) + 1)) / max(1, trainer.max_epochs or 1)
        try:
            if create or self.progress_id is None:
                self.progress_id = create_progress_artifact(
                    progress=min(100.0, done), description=f"Epochs of {self.run_key} done (% of max_epochs)"
                )
            else:
                update_progress_artifact(self.progress_id, min(100.0, done))
        except Exception as exc:  # noqa: BLE001 - never fail a training for the UI
            log.warning("could not publish the training progress: %s", exc)


def _fmt(column: str, value: Any) -> Any:
    if column == "epoch":
        return int(value)
    return float(f"{value:.6g}") if isinstance(value, float) else value


def make_curve_recorder(ckpt_dir: Path, run_key: str, monitor: str, **kwargs: Any) -> CurveRecorder:
    """The curves callback of one training (see :class:`CurveRecorder`)."""
    return CurveRecorder(ckpt_dir, run_key, monitor, **kwargs)
