"""The one place that decides a training's hardware, precision and threads.

Order of precedence, highest first:

1. the run's own fields (:class:`HardwareRequest`, e.g. from a flow parameter);
2. ``INDUSFLOW_TRAIN_*`` variables that are set (:class:`~infra.settings.TrainSettings`);
3. the flow's resource spec in the deployment config (``resources:`` in deployments.yaml);
4. the hardware: a GPU when there is one, bf16-mixed on GPUs with bf16, 16-mixed on older
   GPUs, 32-true on CPU; torch threads = the usable cores.

Flows call :func:`resolve_training` and hand the resolved :class:`~infra.resources.TrainerArgs`
to the training task; tasks never read the deployment file.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from infra.deploy_config import resource_spec
from infra.hardware import auto_precision, usable_cpus
from infra.resources import TrainerArgs, trainer_args
from infra.settings import get_train_settings

#: Trainings are deterministic unless a run asks otherwise (HardwareRequest.deterministic): the same run gives
#: the same weights on the same hardware class, and bench/determinism_bench.py measures what it costs on CPU.
DETERMINISTIC = True


class HardwareRequest(BaseModel):
    """Hardware asked for by one run (None: decided by settings, resource spec, hardware)."""

    model_config = ConfigDict(frozen=True)

    accelerator: str | None = Field(default=None, description="Lightning accelerator: cpu, gpu, cuda, mps.")
    devices: str | int | None = Field(default=None, description="Lightning devices: a count or a list.")
    precision: str | None = Field(default=None, description="Lightning precision, e.g. 32-true, bf16-mixed.")
    strategy: str | None = Field(default=None, description="Lightning strategy: ddp, fsdp, ...")
    num_threads: int | None = Field(default=None, ge=1, description="torch CPU threads.")
    deterministic: bool | None = Field(default=None, description="Deterministic algorithms (None: on).")


def resolve_training(flow_name: str | None = None, request: HardwareRequest | None = None) -> TrainerArgs:
    """Trainer hardware for a run of ``flow_name`` on this machine (see the module docstring)."""
    request = request or HardwareRequest()
    settings = get_train_settings()
    explicit = settings.model_fields_set
    profile = resource_spec(flow_name) if flow_name else None
    hardware_forced = request.accelerator is not None or request.devices is not None or bool(
        explicit & {"accelerator", "devices"}
    )
    if profile is not None and not hardware_forced:
        base = trainer_args(profile)  # falls back to CPU or refuses without the GPUs
    else:
        accelerator = request.accelerator or settings.accelerator
        devices: str | int = request.devices if request.devices is not None else settings.devices
        if isinstance(devices, str) and devices.isdigit():
            devices = int(devices)
        base = TrainerArgs(accelerator=accelerator, devices=devices, precision="auto", strategy=settings.strategy)
    precision = request.precision or (settings.precision if "precision" in explicit else base.precision)
    if precision == "auto":
        precision = auto_precision(base.accelerator)
    strategy = request.strategy or (settings.strategy if "strategy" in explicit else base.strategy)
    spec_threads = int(profile.cpus) if profile is not None and profile.cpus and profile.cpus >= 1 else None
    threads = request.num_threads or settings.num_threads or spec_threads or usable_cpus()
    deterministic = request.deterministic if request.deterministic is not None else DETERMINISTIC
    return base.model_copy(update={"precision": precision, "strategy": strategy, "num_threads": threads,
                                   "deterministic": deterministic})
