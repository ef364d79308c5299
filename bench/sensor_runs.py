"""What the sensor quality benches share: the 1D-CNN trained (or fine-tuned from a
pre-trained encoder) exactly as ``sensor-train`` trains it, the masked-reconstruction
pre-training, the validation-curve recorder and its plot.

Imported by ``bench/sensor_cv.py`` and ``bench/sensor_label_efficiency.py`` (run from the
project root, which they put on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def bench_environment(threads: int) -> None:
    """A throw-away home, no progress bars, ``threads`` torch threads (set before importing torch code)."""
    import os
    import tempfile

    os.environ.setdefault("INDUSFLOW_HOME", tempfile.mkdtemp(prefix="bench-sensor-"))
    os.environ["INDUSFLOW_TRAIN_NUM_THREADS"] = str(threads)
    import tasks.train
    tasks.train.PROGRESS_BAR = False  # time the training, not the bar
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    import torch

    torch.set_num_threads(threads)


def curve_recorder() -> Any:
    """A Lightning callback that keeps the validation RMSE of every epoch."""
    from lightning.pytorch.callbacks import Callback

    class CurveRecorder(Callback):
        def __init__(self) -> None:
            self.val_rmse: list[float] = []

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            value = trainer.callback_metrics.get("val/rmse")
            if value is not None and not trainer.sanity_checking:
                self.val_rmse.append(float(value))

    return CurveRecorder()


def pretrain_encoder(grid: Any, splits: dict[str, list[str]], normalizer: Any, config: Any, wcfg: Any,
                     run_key: str, extra_rows: Any = None) -> dict[str, Any]:
    """Masked-reconstruction pre-training on the unlabelled windows of the training (and,
    for its early stopping, validation) assets; the pre-trained state dict.

    ``extra_rows`` (a grid, e.g. the held-out assets as cut for testing: the readings a
    C-MAPSS test file holds, never their RUL) adds its windows to the pre-training windows.
    """
    import numpy as np

    from solutions.sensor import pipeline as P
    from solutions.sensor.features import make_windows
    from solutions.sensor.model import WindowDataModule
    from tasks.train import TrainSpec, train_model

    pcfg = config.pretrain
    tr, va = P.pretrain_windows(grid, splits, normalizer, wcfg, pcfg.stride)
    x = tr.x
    if extra_rows is not None and len(extra_rows):
        extra = make_windows(extra_rows, normalizer, length=wcfg.length, stride=pcfg.stride)
        x = np.concatenate([x, extra.x]) if len(extra) else x
    module = P.build_pretrainer(len(normalizer.channels_), config.model, pcfg)
    train_model(module, WindowDataModule((x,), (va.x,), pcfg.batch_size, seed=pcfg.seed),
                TrainSpec(run_key=run_key, max_epochs=pcfg.max_epochs, patience=pcfg.patience, monitor="val/loss",
                          seed=pcfg.seed))
    return module.state_dict()


@dataclass
class CnnRun:
    """One trained CNN: its predictions on the test protocol and its validation curve."""

    last: np.ndarray  # RUL on the last window of each cut test unit
    every: np.ndarray  # RUL on every window of the test assets' trajectories
    val: np.ndarray  # RUL on the RUL validation windows (``data.rul_val``: what the flow chooses on)
    val_rmse: list[float]
    best_epoch: int | None
    seconds: float


def train_cnn(data: Any, n_channels: int, config: Any, wcfg: Any, seed: int, run_key: str,
              encoder: dict[str, Any] | None = None) -> CnnRun:
    """Train the RUL/failure CNN as ``sensor-train`` does (fine-tuning when ``encoder`` is given)."""
    import time

    from solutions.sensor import pipeline as P
    from solutions.sensor.inference import predict
    from solutions.sensor.model import WindowDataModule
    from tasks.finetune import finetune_model
    from tasks.train import TrainSpec, train_model

    ft = config.finetune
    t0 = time.perf_counter()
    model = P.build_predictor(n_channels, config.model, wcfg, ft.lr, data.train.fail, ft, seed=seed)  # init follows the seed too
    dm = WindowDataModule((data.train.x, data.train.rul, data.train.fail), (data.rul_val.x, data.rul_val.rul, data.rul_val.fail),
                          ft.batch_size, ft.min_samples_per_epoch, seed)
    spec = TrainSpec(run_key=run_key, **{**P.train_spec_fields(config), "seed": seed})
    recorder = curve_recorder()
    if encoder is not None:
        model.load_encoder(encoder)
        result = finetune_model(model, dm, spec, mode=ft.mode, groups=P.unfreeze_groups(config),
                                every_n_epochs=ft.unfreeze_every, callbacks=[recorder],
                                unfrozen_lr_ratio=ft.unfrozen_lr_ratio).train
    else:
        result = train_model(model, dm, spec, callbacks=[recorder])
    last, _ = predict(model, data.test_last.x)
    every, _ = predict(model, data.test_all.x)
    val, _ = predict(model, data.rul_val.x)
    best = Path(result.best_checkpoint).stem if result.best_checkpoint else ""
    best_epoch = int(best.split("=")[-1]) + 1 if "=" in best else None
    return CnnRun(last, every, val, recorder.val_rmse, best_epoch, round(time.perf_counter() - t0, 1))


def smoothed(values: list[float], weight: float | None) -> list[float]:
    """The bias-corrected moving average the early stopping follows (as in ``tasks.train``)."""
    if weight is None:
        return list(values)
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**i))
    return out


def plot_curves(curves: list[dict[str, Any]], weight: float | None, path: Path, group: str = "fold") -> Path:
    """Validation RMSE per epoch of every CNN run (raw: thin, smoothed: thick, best epoch:
    dotted), one panel per model; colours follow ``group``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = sorted({c["model"] for c in curves})
    fig, axes = plt.subplots(1, len(variants), figsize=(6 * len(variants), 4), squeeze=False, sharey=True)
    groups = sorted({c[group] for c in curves})
    for ax, variant in zip(axes[0], variants):
        labelled: set[Any] = set()
        for c in (x for x in curves if x["model"] == variant):
            color = f"C{groups.index(c[group]) % 10}"
            epochs = range(1, len(c["val_rmse"]) + 1)
            ax.plot(epochs, c["val_rmse"], color=color, alpha=0.35, lw=0.8)
            ax.plot(epochs, smoothed(c["val_rmse"], weight), color=color, lw=1.8,
                    label=None if c[group] in labelled else f"{group} {c[group]}")
            labelled.add(c[group])
            if c.get("best_epoch"):
                ax.axvline(c["best_epoch"], color=color, ls=":", lw=0.6)
        ax.set_title(f"{variant}: validation RMSE per epoch")
        ax.set_xlabel("epoch")
        ax.set_ylabel("RMSE (cycles, RUL capped)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
