"""Fine-tune a model by training only its top parameters, or by progressive unfreezing."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

from prefect import task
from pydantic import BaseModel, ConfigDict

from tasks.cache import RESULT_SERIALIZER, training_run_policy
from tasks.train import TrainResult, TrainSpec, fit_once, train_model

log = logging.getLogger(__name__)


class FreezeReport(BaseModel):
    """How much of a model is trainable."""

    model_config = ConfigDict(frozen=True)

    total_params: int
    trainable_params: int
    trainable_fraction: float
    trainable_tensors: list[str]


class FinetuneResult(BaseModel):
    """A fine-tuning run: the training result plus what was trainable."""

    model_config = ConfigDict(frozen=True)

    train: TrainResult
    freeze: FreezeReport
    mode: str


def freeze_report(module: Any) -> FreezeReport:
    """Count trainable parameters of ``module``."""
    total = trainable = 0
    names = []
    for name, p in module.named_parameters():
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
            names.append(name)
    return FreezeReport(
        total_params=total,
        trainable_params=trainable,
        trainable_fraction=trainable / total if total else 0.0,
        trainable_tensors=names,
    )


def freeze_all_but_top(module: Any, fraction: float = 0.10) -> FreezeReport:
    """Freeze everything, then unfreeze whole layers from the output end.

    "Top" follows registration order: the last-registered layers (nearest the output in
    a feed-forward model) are unfrozen, a layer's weight and bias together, while the
    trainable share stays within ``fraction`` of all parameters. At least the last layer
    is unfrozen; if it alone is over the budget the report says so (its
    ``trainable_fraction`` is then above ``fraction``) and a warning is logged.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    params = list(module.named_parameters())
    if not params:
        raise ValueError("the module has no parameters")
    total = sum(p.numel() for _, p in params)
    budget = fraction * total
    for _, p in params:
        p.requires_grad_(False)
    layers: dict[str, list[Any]] = {}
    for name, p in reversed(params):
        layers.setdefault(name.rpartition(".")[0], []).append(p)
    used = 0
    for i, tensors in enumerate(layers.values()):
        size = sum(p.numel() for p in tensors)
        if i > 0 and used + size > budget:
            break
        for p in tensors:
            p.requires_grad_(True)
        used += size
    report = freeze_report(module)
    if report.trainable_fraction > fraction:
        log.warning(
            "the top tensor alone holds %.1f%% of the parameters (budget %.1f%%)",
            100 * report.trainable_fraction,
            100 * fraction,
        )
    return report


def _progressive_callback(groups: Sequence[str], every_n_epochs: int, unfrozen_lr_ratio: float = 0.1) -> Any:
    from lightning.pytorch.callbacks import BaseFinetuning

    class ProgressiveUnfreezing(BaseFinetuning):
        """Start with only ``groups[0]`` trainable; unfreeze the next group every N epochs."""

        def __init__(self) -> None:
            super().__init__()
            self.groups = list(groups)
            self.every = every_n_epochs

        def freeze_before_training(self, pl_module: Any) -> None:
            self.freeze(pl_module, train_bn=False)
            self.make_trainable(pl_module.get_submodule(self.groups[0]))

        def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
            index = epoch // self.every
            if 1 <= index < len(self.groups) and epoch % self.every == 0:
                group = pl_module.get_submodule(self.groups[index])
                self.unfreeze_and_add_param_group(modules=group, optimizer=optimizer, train_bn=True,
                                                  initial_denom_lr=1.0 / unfrozen_lr_ratio)
                log.info("epoch %d: unfroze %s", epoch, self.groups[index])

    return ProgressiveUnfreezing()


def finetune_model(
    module: Any,
    datamodule: Any,
    spec: TrainSpec,
    *,
    mode: Literal["top", "progressive"] = "top",
    fraction: float = 0.10,
    groups: Sequence[str] = (),
    every_n_epochs: int = 1,
    callbacks: Sequence[Any] = (),
    unfrozen_lr_ratio: float = 0.1,
) -> FinetuneResult:
    """Fine-tune ``module`` (weights already loaded, e.g. from the registry).

    Args:
        mode: ``top`` trains only the top ``fraction`` of parameters; ``progressive``
            unfreezes the submodules named in ``groups`` (top first) one every
            ``every_n_epochs`` epochs, through a Lightning ``BaseFinetuning`` callback.
        unfrozen_lr_ratio: learning rate of a group unfrozen by ``progressive``, as a share of
            the optimiser's current rate (Lightning's default: 0.1).
        callbacks: extra Lightning callbacks, passed on to :func:`tasks.train.train_model`.
    """
    unfreezing: list[Any] = []
    if mode == "top":
        report = freeze_all_but_top(module, fraction)
    elif mode == "progressive":
        if not groups:
            raise ValueError("progressive unfreezing needs the submodule names in `groups`")
        for name in groups:
            module.get_submodule(name)  # fail early on a wrong name
        if not unfrozen_lr_ratio > 0:
            raise ValueError(f"unfrozen_lr_ratio must be > 0, got {unfrozen_lr_ratio}")
        unfreezing.append(_progressive_callback(groups, every_n_epochs, unfrozen_lr_ratio))
        for p in module.parameters():
            p.requires_grad_(False)
        for p in module.get_submodule(groups[0]).parameters():
            p.requires_grad_(True)
        report = freeze_report(module)
    else:
        raise ValueError(f"unknown fine-tuning mode {mode!r}: use 'top' or 'progressive'")
    log.info(
        "fine-tuning %d of %d parameters (%.1f%%), mode %s",
        report.trainable_params,
        report.total_params,
        100 * report.trainable_fraction,
        mode,
    )
    result = train_model(module, datamodule, spec, callbacks=[*unfreezing, *callbacks])
    if mode == "progressive":
        report = freeze_report(module)
    return FinetuneResult(train=result, freeze=report, mode=mode)


_finetune_model_cached = task(
    finetune_model,
    name="finetune-model",
    description="Fine-tune the top parameters of a model, or unfreeze it progressively; a finished run key is "
    "Cached.",
    cache_policy=training_run_policy(),
    result_serializer=RESULT_SERIALIZER,
)


def finetune_model_task(module: Any, datamodule: Any, spec: TrainSpec, **options: Any) -> FinetuneResult:
    """:func:`finetune_model` as the Prefect task ``finetune-model``, idempotent by its run key
    (:func:`tasks.train.fit_once`): a finished run key shows Cached and ``module`` gets its best
    weights (its parameters are then left as trainable as they were)."""
    return fit_once(_finetune_model_cached, module, datamodule, spec, lambda r: r.train,
                    lambda r, t: r.model_copy(update={"train": t}), **options)
