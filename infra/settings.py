"""Project settings: one pydantic-settings class per area, each with its own env prefix.

Settings are read lazily: call the ``get_*`` functions when a value is needed, never at
import time, so that tests and users can change the environment before a run starts.
Settings hold URLs, keys and paths; they are not flow parameters and never appear in logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PrecisionName = Literal["auto", "32-true", "16-mixed", "bf16-mixed", "64-true"]


class CoreSettings(BaseSettings):
    """Where the project writes, and how it logs."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_", extra="ignore")

    home: Path = Field(
        default=Path("~/.indusflow"),
        description="Home folder for everything the project writes: datasets, artifacts, "
        "checkpoints, the model registry and reports.",
    )
    log_level: str = Field(default="INFO", description="Log level of the indusflow loggers.")

    def resolved_home(self) -> Path:
        """The home folder, with ``~`` expanded and made absolute."""
        return self.home.expanduser().resolve()


class TrainSettings(BaseSettings):
    """Hardware and determinism knobs for every training run."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_TRAIN_", extra="ignore")

    accelerator: str = Field(
        default="auto", description="Lightning accelerator: auto, cpu, gpu, cuda, mps."
    )
    devices: str = Field(
        default="auto", description="Lightning devices: auto, a count (e.g. 2) or a list (0,1)."
    )
    precision: PrecisionName = Field(
        default="auto",
        description="Training precision. 'auto' picks bf16-mixed on GPUs with bf16, "
        "16-mixed on older GPUs and 32-true on CPU.",
    )
    strategy: str = Field(default="auto", description="Lightning strategy: auto, ddp, fsdp.")
    num_threads: int | None = Field(
        default=None,
        ge=1,
        description="CPU threads for torch. Default: the number of usable cores. "
        "Oversubscribed threads slow small models by 10x or more.",
    )
    progress_bar: bool | None = Field(
        default=None,
        description="Show Lightning's progress bar. Default: only when stderr is a terminal.",
    )


class PrefectSetupSettings(BaseSettings):
    """Defaults applied to Prefect when a flow is started from the command line."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_PREFECT_", extra="ignore")

    analytics_enabled: bool = Field(
        default=False,
        description="Prefect server telemetry. Off by default: on a fresh Prefect home its "
        "insert races the ephemeral server's migrations and logs 'database is locked'.",
    )
    ephemeral_startup_timeout_s: int = Field(
        default=120,
        ge=10,
        description="How long to wait for Prefect's ephemeral API to start (the first start "
        "on a new home runs database migrations and takes 20-40 s on 2 cores).",
    )


def get_core_settings() -> CoreSettings:
    """Read the core settings from the environment now."""
    return CoreSettings()


def get_train_settings() -> TrainSettings:
    """Read the training settings from the environment now."""
    return TrainSettings()


def get_prefect_setup_settings() -> PrefectSetupSettings:
    """Read the Prefect set-up settings from the environment now."""
    return PrefectSetupSettings()
