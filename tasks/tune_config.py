"""How a study searches (:class:`TuneConfig`): a flow parameter, so it lives in a light module
(pydantic only) that the command line reads without importing Prefect or Optuna."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TuneConfig(BaseModel):
    """How to search: trial count, parallelism, sampler and pruner."""

    model_config = ConfigDict(frozen=True)

    trials: int = Field(default=20, ge=1, description="Finished trials (complete + pruned) wanted in the study.")
    max_in_flight: int | None = Field(
        default=None, ge=1,
        description="Trials in flight at once (default: the runner's workers, INDUSFLOW_RUNNER_WORKERS; on the "
        "thread runner they train one after another).",
    )
    study: str | None = Field(default=None, description="Study name; the same name resumes the same study.")
    seed: int = Field(default=0, description="Seed of the TPE sampler.")
    startup_trials: int = Field(default=5, ge=1, description="Random trials before TPE takes over.")
    prune_after_trials: int = Field(default=3, ge=0, description="Complete trials before the pruner may stop one.")
    warmup_epochs: int = Field(default=1, ge=0, description="Epochs of every trial that are never pruned.")
    enqueue_defaults: bool = Field(
        default=True, description="Run the config's default values as the first trial (a reference point)."
    )
    max_failures: int = Field(default=3, ge=0, description="Failed trials tolerated in one run before it stops.")
