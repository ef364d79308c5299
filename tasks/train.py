"""Train any LightningModule + LightningDataModule, resumably.

The checkpoint folder is fixed by the run key, so re-running an interrupted training
resumes from ``last.ckpt`` instead of starting over. A finished one is not retrained: inside a
flow, Prefect's cache skips a run key that finished (:func:`train_model_task`, its run shows
Cached); ``train_result.json`` beside the checkpoints records what the run produced, for people.
Every epoch's loss, validation metric, learning rate and gradient norm go to ``curves.csv``
beside the checkpoints and, inside a Prefect run, to a table artifact updated while it trains
(:mod:`tasks.curves`); TensorBoard logs too when ``tensorboard`` is installed. Multi-process
strategies (ddp) work as Lightning launches them: rank 0 alone cleans up and writes the result.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

from prefect import Task, task
from pydantic import BaseModel, ConfigDict, Field

from infra.compute import resolve_training
from infra.determinism import RANDOM_STATE_LOCK
from infra.hardware import set_cpu_threads
from infra.home import home_layout
from infra.resources import TrainerArgs, gpu_slot
from infra.store import write_json_atomic
from tasks.cache import RESULT_SERIALIZER, training_run_policy

log = logging.getLogger(__name__)

RESULT_FILE = "train_result.json"

R = TypeVar("R")


class TrainSpec(BaseModel):
    """How to train. ``hardware`` comes resolved from :func:`infra.compute.resolve_training`."""

    model_config = ConfigDict(frozen=True)

    run_key: str = Field(description="Fixes the checkpoint folder; same key = same run.")
    max_epochs: int = Field(default=10, ge=1)
    min_epochs: int = Field(default=1, ge=0)
    patience: int = Field(default=3, ge=1, description="Early-stopping patience (epochs).")
    monitor: str = Field(default="val/loss", description="Metric for early stopping and best.")
    mode: Literal["min", "max"] = "min"
    seed: int = 0
    hardware: TrainerArgs | None = Field(
        default=None, description="Resolved hardware (None: resolved from settings and the machine)."
    )
    gradient_clip_val: float | None = 1.0
    limit_train_batches: float | int | None = None
    limit_val_batches: float | int | None = None
    fresh: bool = Field(default=False, description="Delete earlier checkpoints of this key.")
    smoothing: float | None = Field(
        default=None, ge=0, lt=1,
        description="Early stopping and the best checkpoint follow a bias-corrected moving average of "
        "the monitored metric, logged as '<monitor>_smooth' (this weight on the past, e.g. 0.7), so a noisy "
        "validation metric does not stop training early. None: the raw metric.",
    )


class TrainResult(BaseModel):
    """What a training run produced."""

    model_config = ConfigDict(frozen=True)

    run_key: str
    checkpoint_dir: str
    best_checkpoint: str | None
    last_checkpoint: str | None
    best_score: float | None
    monitor: str
    epochs_completed: int = Field(description="Epochs finished in total, resumed ones included.")
    epochs_trained_now: list[int] = Field(description="Epoch indices trained by this call.")
    resumed_from_epoch: int | None = Field(description="First epoch of this call if resumed.")
    reused_completed: bool = Field(
        default=False, description="Training had already finished: Prefect's cache skipped it (the run shows Cached).")
    stopped_early: bool = False
    precision: str
    accelerator: str
    train_seconds: float
    samples_per_s: float | None
    metrics: dict[str, float] = Field(default_factory=dict)
    samples_per_cpu_s: float | None = Field(
        default=None, description="Training samples per CPU second of this process (robust to a busy machine).")
    curves_csv: str | None = Field(default=None, description="Per-epoch curves (CSV) beside the checkpoints.")


def _lightning():
    import lightning as L

    return L


class _DropAdverts(logging.Filter):
    """Drops Lightning's advertising tip from the logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage().lower()


def _one_console_for_lightning() -> None:
    """Let each Lightning log line reach the console once.

    Importing ``lightning`` gives its ``lightning`` logger a stderr handler of its own
    (``INFO: ...``) while its records also propagate to the root logger, where Prefect's
    console handler sits: every line printed twice. When the root logger has a handler,
    Lightning's own stream handlers go and its loggers propagate, so the lines print once,
    in the format of the rest of the run (and a caller's own handlers stay untouched).
    Without a root handler (plain Python, no Prefect) Lightning keeps its console.
    """
    if not logging.getLogger().handlers:
        return
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:  # the ones Lightning installs
                logger.removeHandler(handler)
        logger.propagate = True


def _quiet_lightning() -> None:
    """Silence messages that are expected here (a reused checkpoint folder, adverts) and
    print Lightning's lines once."""
    _one_console_for_lightning()
    warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*smaller than the logging interval.*")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAdverts) for f in logger.filters):
            logger.addFilter(_DropAdverts())


def epoch_progress(epoch: int, max_epochs: int | None, trained_now: int, seconds_now: float) -> str:
    """``epoch i/N (p%), s/epoch, elapsed, ETA`` of a training (rate and ETA from the epochs this
    call trained, validation included; the ETA is an upper bound: early stopping may end it sooner)."""
    from tasks.progress import format_interval

    total = max_epochs if max_epochs and max_epochs > 0 else epoch
    per = seconds_now / trained_now if trained_now > 0 else 0.0
    left = max(0, total - epoch)
    return (f"epoch {epoch}/{total} ({100.0 * epoch / total:.0f}%), {per:.1f} s/epoch, "
            f"elapsed {format_interval(seconds_now)}, ETA {format_interval(left * per) if per else '?'}"
            + (" at most" if left and per else ""))


def _make_epoch_recorder():
    from lightning.pytorch.callbacks import Callback

    class EpochRecorder(Callback):
        """Records which epochs this call trained and the training throughput."""

        def __init__(self) -> None:
            self.start_epoch: int | None = None
            self.epochs: list[int] = []
            self.samples = 0
            self.seconds = 0.0
            self.cpu_seconds = 0.0
            self._t0 = 0.0
            self._c0 = 0.0

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.start_epoch = trainer.current_epoch
            self._started = time.perf_counter()

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self._t0 = time.perf_counter()
            self._c0 = time.process_time()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            first = batch[0] if isinstance(batch, (list, tuple)) else batch
            if isinstance(first, dict):
                first = next(iter(first.values()))
            self.samples += int(getattr(first, "shape", [1])[0])
            self._t_last = time.perf_counter()
            self._c_last = time.process_time()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            # training batches only (validation runs before this hook in Lightning 2)
            elapsed = max(0.0, getattr(self, "_t_last", self._t0) - self._t0)
            self.seconds += elapsed
            self.cpu_seconds += max(0.0, getattr(self, "_c_last", self._c0) - self._c0)
            self.epochs.append(trainer.current_epoch)
            shown = {
                k: float(v)
                for k, v in trainer.callback_metrics.items()
                if getattr(v, "numel", lambda: 0)() == 1 and not k.endswith("_step")
            }
            log.info(
                "%s: %.1f s of training batches; %s",
                epoch_progress(trainer.current_epoch + 1, trainer.max_epochs, len(self.epochs),
                               time.perf_counter() - getattr(self, "_started", self._t0)),
                elapsed,
                ", ".join(f"{k}={v:.4f}" for k, v in sorted(shown.items())) or "no metrics yet",
            )

    return EpochRecorder()


def _make_stopper(monitor: str, mode: str, patience: int):
    from lightning.pytorch.callbacks import EarlyStopping

    class StaysStopped(EarlyStopping):
        """Lightning's early stopping, kept stopped when a run that stopped early resumes: Lightning
        restores this callback's state from ``last.ckpt`` but not ``trainer.should_stop``, so without
        this a re-run of a finished training would train on past the epoch it stopped at."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if self.stopped_epoch:
                log.info("the run stopped early at epoch %d: nothing left to train", self.stopped_epoch)
                trainer.should_stop = True

    return StaysStopped(monitor=monitor, mode=mode, patience=patience)


def _global_rank() -> int:
    """This process's rank in a multi-process training (0 before the processes start)."""
    import os

    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _loggers(ckpt_dir: Path) -> list[Any]:
    """Lightning's CSV logger, plus TensorBoard's when ``tensorboard`` is installed."""
    import importlib.util

    from lightning.pytorch.loggers import CSVLogger

    loggers: list[Any] = [CSVLogger(save_dir=ckpt_dir, name="logs")]
    if importlib.util.find_spec("tensorboard") is not None:
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(save_dir=ckpt_dir, name="tensorboard", default_hp_metric=False))
    return loggers


def smoothed_name(monitor: str) -> str:
    """The name under which the smoothed ``monitor`` is logged (:attr:`TrainSpec.smoothing`)."""
    return f"{monitor}_smooth"


def _make_smoother(monitor: str, weight: float):
    from lightning.pytorch.callbacks import Callback

    class MetricSmoother(Callback):
        """Logs a bias-corrected exponential moving average of ``monitor`` after each validation."""

        def __init__(self) -> None:
            self.average = 0.0
            self.count = 0

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            value = trainer.callback_metrics.get(monitor)
            if trainer.sanity_checking or value is None:
                return
            self.average = weight * self.average + (1.0 - weight) * float(value)
            self.count += 1
            pl_module.log(smoothed_name(monitor), self.average / (1.0 - weight**self.count), on_epoch=True)

        def state_dict(self) -> dict[str, Any]:
            return {"average": self.average, "count": self.count}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.average, self.count = float(state_dict["average"]), int(state_dict["count"])

    return MetricSmoother()


def checkpoint_dir(run_key: str) -> Path:
    """The checkpoint folder of a run key."""
    return home_layout().checkpoints(run_key)


#: Lightning's progress bar: None shows it only when stderr is a terminal (in a log file or a pipe it is noise);
#: the benches set False so a bench run from a terminal times the training, not the bar.
PROGRESS_BAR: bool | None = None


def _show_progress() -> bool:
    return sys.stderr.isatty() if PROGRESS_BAR is None else PROGRESS_BAR


@contextmanager
def random_state_turn(run_key: str) -> Iterator[None]:
    """Hold :data:`infra.determinism.RANDOM_STATE_LOCK` for a training; say so when another
    training of this process has it (trials train side by side only in worker processes)."""
    if not RANDOM_STATE_LOCK.acquire(blocking=False):
        log.info("run %s waits for another training of this process (torch's random state is process-wide; "
                 "trials train side by side on Dask or Ray worker processes: INDUSFLOW_RUNNER_KIND)", run_key)
        RANDOM_STATE_LOCK.acquire()
    try:
        yield
    finally:
        RANDOM_STATE_LOCK.release()


def train_model(
    module: Any,
    datamodule: Any,
    spec: TrainSpec,
    callbacks: Sequence[Any] = (),
) -> TrainResult:
    """Fit ``module`` on ``datamodule`` and load the best weights back into ``module``.

    Args:
        module: a LightningModule; its weights hold the best checkpoint afterwards.
        datamodule: a LightningDataModule with train and val loaders.
        spec: epochs, early stopping, run key, hardware overrides.
        callbacks: extra Lightning callbacks (e.g. fine-tuning schedules).
    """
    import torch

    L = _lightning()
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tasks.curves import make_curve_recorder

    _quiet_lightning()
    ckpt_dir = checkpoint_dir(spec.run_key)
    # the other ranks of a multi-process run start while rank 0 trains: only rank 0 cleans up
    if spec.fresh and ckpt_dir.exists() and _global_rank() == 0:
        log.info("fresh training asked: removing %s", ckpt_dir)
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    hw = spec.hardware or resolve_training()
    accelerator, devices, precision, strategy = hw.accelerator, hw.devices, hw.precision, hw.strategy

    # torch's random state, thread count and deterministic switch are the process's: a training
    # of another thread (a tuning trial on the thread runner) waits for this one
    with random_state_turn(spec.run_key):
        if accelerator in {"cpu", "auto"} and not torch.cuda.is_available():
            set_cpu_threads(hw.num_threads)
        L.seed_everything(spec.seed, workers=True, verbose=False)

        monitor = spec.monitor if spec.smoothing is None else smoothed_name(spec.monitor)
        smoother = [] if spec.smoothing is None else [_make_smoother(spec.monitor, spec.smoothing)]
        checkpoint = ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best-{epoch:03d}",
            monitor=monitor,
            mode=spec.mode,
            save_top_k=1,
        )
        # last.ckpt after every epoch, from a callback of its own: Lightning 2.6 writes save_last=True
        # only beside a new best checkpoint, so a run whose validation stopped improving would resume
        # from its best epoch and train every epoch since again
        latest = ModelCheckpoint(dirpath=ckpt_dir, filename="last", save_top_k=1, enable_version_counter=False)
        stopper = _make_stopper(monitor, spec.mode, spec.patience)
        recorder = _make_epoch_recorder()
        curves = make_curve_recorder(ckpt_dir, spec.run_key, spec.monitor)
        # GPU runs hold their pool's concurrency slots and claim free cards of this machine, so
        # two trainings never share one card
        with gpu_slot(hw) as cards:
            trainer = L.Trainer(
                default_root_dir=ckpt_dir,
                max_epochs=spec.max_epochs,
                min_epochs=spec.min_epochs,
                accelerator=accelerator,
                devices=cards if cards is not None else devices,
                strategy=strategy,
                precision=precision,
                callbacks=[*smoother, checkpoint, latest, stopper, recorder, curves, *callbacks],
                logger=_loggers(ckpt_dir),
                enable_progress_bar=_show_progress(),
                enable_model_summary=False,
                gradient_clip_val=spec.gradient_clip_val,
                limit_train_batches=spec.limit_train_batches,
                limit_val_batches=spec.limit_val_batches,
                log_every_n_steps=10,
                num_sanity_val_steps=0,
                deterministic=hw.deterministic,
            )
            last = ckpt_dir / "last.ckpt"
            resume = last if last.exists() else None
            if resume:
                log.info("resuming run %s from %s", spec.run_key, resume)
            started = time.perf_counter()
            # weights_only: a checkpoint is read as tensors and plain values, never unpickled as code,
            # whatever torch's own default is
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume) if resume else None, weights_only=True)
    seconds = time.perf_counter() - started

    best = checkpoint.best_model_path or None
    if best:
        load_checkpoint_weights(module, Path(best))
    metrics = {
        k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1
    }
    result = TrainResult(
        run_key=spec.run_key,
        checkpoint_dir=str(ckpt_dir),
        best_checkpoint=best,
        last_checkpoint=str(last) if last.exists() else None,
        best_score=float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None,
        monitor=monitor,
        epochs_completed=trainer.current_epoch,
        epochs_trained_now=recorder.epochs,
        resumed_from_epoch=recorder.start_epoch if resume else None,
        stopped_early=bool(stopper.stopped_epoch),
        precision=str(trainer.precision),
        accelerator=type(trainer.accelerator).__name__.replace("Accelerator", "").lower(),
        train_seconds=seconds,
        samples_per_s=(recorder.samples * trainer.world_size / recorder.seconds) if recorder.seconds > 0 else None,
        metrics=metrics,
        samples_per_cpu_s=(recorder.samples * trainer.world_size / recorder.cpu_seconds)
        if recorder.cpu_seconds > 0 else None,
        curves_csv=str(curves.path) if curves.path.exists() else None,
    )
    if trainer.is_global_zero:
        write_json_atomic(ckpt_dir / RESULT_FILE, json.loads(result.model_dump_json()))
    log.info(
        "trained %s: epochs %s, best %s=%s, %.1f s",
        spec.run_key,
        recorder.epochs,
        spec.monitor,
        result.best_score,
        seconds,
    )
    return result


def load_checkpoint_weights(module: Any, path: Path) -> None:
    """Load a Lightning checkpoint's weights into ``module`` without unpickling code."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    module.load_state_dict(state["state_dict"])


_train_model_cached = task(
    train_model,
    name="train-model",
    description="Fit a LightningModule with early stopping and resumable checkpoints; a finished run key is "
    "Cached.",
    cache_policy=training_run_policy(),
    result_serializer=RESULT_SERIALIZER,
)


def reused(result: TrainResult) -> TrainResult:
    """A finished training's result as a re-run that trained nothing reports it."""
    return result.model_copy(update={"reused_completed": True, "epochs_trained_now": [], "train_seconds": 0.0})


def fit_once(
    fit: Task[..., R],
    module: Any,
    datamodule: Any,
    spec: TrainSpec,
    training_of: Callable[[R], TrainResult],
    with_training: Callable[[R, TrainResult], R],
    **options: Any,
) -> R:
    """Run the training task ``fit`` (cached on its run key) so that its run key trains once.

    A re-run of a finished run key is skipped by Prefect's cache (its task run shows Cached) and
    ``module`` gets that run's best weights, as a trained one does; ``spec.fresh`` trains again
    and replaces the cached result (``refresh_cache``). A cached result whose checkpoint is gone
    trains again.

    Args:
        fit: the task, called as ``fit(module, datamodule, spec, **options)``.
        training_of: the :class:`TrainResult` inside the task's result.
        with_training: the task's result with another :class:`TrainResult`.
    """
    first = fit.with_options(refresh_cache=True) if spec.fresh else fit
    state = first(module, datamodule, spec, return_state=True, **options)
    result: R = state.result()
    if state.name != "Cached":
        return result
    trained = training_of(result)
    best = Path(trained.best_checkpoint) if trained.best_checkpoint else None
    if best is None or not best.exists():
        log.warning("run %s: the cached training's checkpoint %s is gone; training again", spec.run_key, best)
        return fit.with_options(refresh_cache=True)(module, datamodule, spec, **options)
    load_checkpoint_weights(module, best)
    log.info("run %s already trained %d epochs (Prefect's cache); loaded %s", spec.run_key,
             trained.epochs_completed, best.name)
    return with_training(result, reused(trained))


def train_model_task(
    module: Any,
    datamodule: Any,
    spec: TrainSpec,
    callbacks: Sequence[Any] = (),
) -> TrainResult:
    """:func:`train_model` as the Prefect task ``train-model``, idempotent by its run key
    (:func:`fit_once`): a finished run key shows Cached and ``module`` gets its best weights."""
    return fit_once(_train_model_cached, module, datamodule, spec, lambda r: r, lambda _, t: t, callbacks=callbacks)
