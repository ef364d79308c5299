"""Declarative compute resources of a flow, and what they map to.

One :class:`ResourceSpec` per flow lives in the operations config
(``infra/deployments.yaml`` or the file named by ``INDUSFLOW_DEPLOY_CONFIG``). The same
spec gives

- the Lightning Trainer arguments (accelerator, devices, precision, strategy, threads), with a
  CPU fallback or a refusal when the requested GPU is not there (``on_missing_gpu``);
- the Prefect global concurrency limit that keeps two GPU trainings off one card:
  a training on GPU occupies ``devices`` slots of the limit named after its GPU pool,
  whose size is the number of cards in that pool.
"""

from __future__ import annotations

import fcntl
import logging
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.errors import IndusflowError

log = logging.getLogger(__name__)

#: INDUSFLOW_HOME inside the worker image (the Dockerfile's ``ENV INDUSFLOW_HOME``).
IMAGE_HOME = "/data/indusflow"


class ResourceError(IndusflowError):
    """The requested hardware is not available and the spec says to refuse."""


class ResourceSpec(BaseModel):
    """What one flow asks of the machine that runs it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        default="auto",
        description="GPUs per run: a count (0: CPU only), or auto: one GPU when the machine has "
        "one, else CPU without a warning.",
    )
    gpu_type: str | None = Field(
        default=None,
        description="GPU type, e.g. nvidia-a100; names the GPU pool and its concurrency limit "
        "(a Kubernetes pool's gpu_type job variable in prefect.yaml selects its nodes).",
    )
    cpus: float | None = Field(default=None, gt=0, description="CPU cores per run: its training's torch threads.")
    precision: str = Field(default="auto", description="Lightning precision; auto picks by hardware.")
    devices: int | str | None = Field(
        default=None, description="Lightning devices; default: gpus when gpus > 0, else auto."
    )
    strategy: str = Field(default="auto", description="Lightning strategy: auto, ddp, fsdp.")
    on_missing_gpu: Literal["fallback", "refuse"] = Field(
        default="fallback",
        description="Without the requested GPU: train on CPU with a warning, or refuse to run.",
    )

    @property
    def concurrency_name(self) -> str | None:
        """The global concurrency limit of this spec's GPU pool (None for CPU specs)."""
        if self.gpus == 0:
            return None
        return f"gpu-{self.gpu_type or 'any'}"


class TrainerArgs(BaseModel):
    """Lightning Trainer hardware arguments resolved for this machine."""

    model_config = ConfigDict(frozen=True)

    accelerator: str
    devices: int | str
    precision: str
    strategy: str
    gpu_slots: int = Field(default=0, description="Slots to occupy on the GPU pool's limit.")
    concurrency_name: str | None = None
    fell_back: bool = False
    num_threads: int | None = Field(default=None, ge=1, description="torch CPU threads (None: leave torch's).")
    deterministic: bool = Field(default=True, description="Lightning deterministic=True (torch deterministic algorithms).")


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def trainer_args(spec: ResourceSpec, available_gpus: int | None = None) -> TrainerArgs:
    """Map a spec to Trainer arguments on this machine (fallback or refusal without GPUs)."""
    from infra.hardware import auto_precision

    have = cuda_count() if available_gpus is None else available_gpus
    if spec.gpus == "auto":
        spec = spec.model_copy(update={"gpus": 1 if have else 0})
    if spec.gpus == 0:
        precision = "32-true" if spec.precision == "auto" else spec.precision
        return TrainerArgs(accelerator="cpu", devices=spec.devices or "auto", precision=precision,
                           strategy=spec.strategy)
    if have < spec.gpus:
        what = f"{spec.gpus} GPU(s){f' of type {spec.gpu_type}' if spec.gpu_type else ''}"
        if spec.on_missing_gpu == "refuse":
            raise ResourceError(
                f"this run asks for {what} but the machine has {have}; "
                "set on_missing_gpu: fallback in the resource spec to train on CPU instead"
            )
        log.warning("this run asks for %s but the machine has %d: falling back to CPU (32-true)", what, have)
        return TrainerArgs(accelerator="cpu", devices="auto", precision="32-true", strategy="auto", fell_back=True)
    devices = spec.devices if spec.devices is not None else spec.gpus
    precision = auto_precision("gpu") if spec.precision == "auto" else spec.precision
    slots = devices if isinstance(devices, int) else spec.gpus
    return TrainerArgs(accelerator="gpu", devices=devices, precision=precision, strategy=spec.strategy,
                       gpu_slots=slots, concurrency_name=spec.concurrency_name)


def _lock_dir() -> Path:
    """Machine-wide folder of the per-card locks (all homes and users of this machine)."""
    path = Path(tempfile.gettempdir()) / "indusflow-gpu-locks"
    path.mkdir(mode=0o1777, parents=True, exist_ok=True)
    return path


@contextmanager
def claim_cards(count: int, total: int, timeout_s: float | None = None, poll_s: float = 2.0) -> Iterator[list[int]]:
    """Hold ``count`` of this machine's ``total`` GPUs exclusively (one lock file per card).

    The pool's concurrency limit admits a training cluster-wide; this picks *which* cards on
    the machine, so two trainings with ``devices: 1`` on a 4-GPU box get cards 0 and 1
    rather than both landing on card 0.
    """
    if count > total:
        raise ResourceError(f"asked for {count} GPU(s) but the machine has {total}")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        held: list[tuple[int, Any]] = []
        for index in range(total):
            handle = open(_lock_dir() / f"cuda-{index}.lock", "a")  # noqa: SIM115 - held while the GPU is
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            held.append((index, handle))
            if len(held) == count:
                break
        if len(held) == count:
            try:
                yield [index for index, _ in held]
            finally:
                for _, handle in held:
                    fcntl.flock(handle, fcntl.LOCK_UN)
                    handle.close()
            return
        for _, handle in held:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        if deadline is not None and time.monotonic() > deadline:
            raise ResourceError(f"no {count} free GPU(s) of {total} on this machine within {timeout_s} s")
        time.sleep(poll_s)


@contextmanager
def gpu_slot(args: TrainerArgs, timeout_s: float | None = None,
             total_cards: int | None = None) -> Iterator[list[int] | None]:
    """Hold the GPUs of one training: ``args.gpu_slots`` slots of the GPU pool's Prefect
    global concurrency limit (inside a flow or task run), then that many free cards of this
    machine. Yields the card indices for the Trainer's ``devices`` (None on CPU).

    Outside a Prefect run (plain function calls) only the cards are claimed. Without the
    limit on the server (``prefect deploy``'s build step creates it) Prefect admits the run.
    """
    if not args.gpu_slots or not args.concurrency_name:
        yield None
        return
    total = cuda_count() if total_cards is None else total_cards
    from prefect.context import FlowRunContext, TaskRunContext

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        with claim_cards(args.gpu_slots, total, timeout_s) as cards:
            yield cards
        return
    from prefect.concurrency.sync import concurrency

    log.info("waiting for %d slot(s) of GPU pool limit %r", args.gpu_slots, args.concurrency_name)
    with concurrency(args.concurrency_name, occupy=args.gpu_slots, timeout_seconds=timeout_s, strict=False), \
            claim_cards(args.gpu_slots, total, timeout_s) as cards:
        log.info("training on GPU(s) %s", cards)
        yield cards
