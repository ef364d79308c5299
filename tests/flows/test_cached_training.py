"""A training is idempotent by its run key through Prefect's cache: a re-run's task run shows Cached
and the model still gets the run's best weights; ``fresh`` trains again."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from prefect import flow

from tasks.finetune import FinetuneResult, finetune_model_task
from tasks.train import TrainResult, TrainSpec, train_model_task
from tests.flows.run_states import task_states
from tests.flows.test_train_curves import Data, Tiny


@flow(name="cached-training-probe")
def train_tiny(spec: TrainSpec) -> tuple[TrainResult, dict[str, torch.Tensor]]:
    """Train a fresh (randomly initialised) model; return the result and the weights it ends with."""
    torch.manual_seed(1234)  # the same initial weights on every run: unequal to the trained ones
    model = Tiny()
    result = train_model_task(model, Data(), spec)
    return result, {k: v.clone() for k, v in model.state_dict().items()}


def _run(spec: TrainSpec) -> tuple[TrainResult, dict[str, torch.Tensor], str]:
    state = train_tiny(spec, return_state=True)
    result, weights = state.result()
    return result, weights, task_states(state.state_details.flow_run_id, {"train-model"})["train-model"]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_rerun_of_the_same_run_key_is_cached_with_the_trained_weights() -> None:
    spec = TrainSpec(run_key="cached-training", max_epochs=2, patience=9)
    first, trained, first_state = _run(spec)
    assert first_state == "Completed" and first.epochs_trained_now == [0, 1] and not first.reused_completed

    again, reloaded, again_state = _run(spec)
    assert again_state == "Cached"
    assert again.reused_completed and again.epochs_trained_now == [] and again.best_checkpoint == first.best_checkpoint
    assert _same(reloaded, trained)  # the cached run's model holds the best checkpoint, not its initial weights

    fresh, _, fresh_state = _run(spec.model_copy(update={"fresh": True}))
    assert fresh_state == "Completed" and fresh.epochs_trained_now == [0, 1]


def test_a_cached_run_whose_checkpoints_are_gone_trains_again() -> None:
    spec = TrainSpec(run_key="cached-training-deleted", max_epochs=1, patience=9)
    first, _, _ = _run(spec)
    shutil.rmtree(Path(first.checkpoint_dir))
    again, _, _ = _run(spec)
    assert again.epochs_trained_now == [0] and not again.reused_completed
    assert Path(again.best_checkpoint).exists()


@flow(name="cached-finetuning-probe")
def finetune_tiny(spec: TrainSpec) -> tuple[FinetuneResult, dict[str, torch.Tensor]]:
    """Fine-tune the top of a fresh model; return the result and the weights it ends with."""
    torch.manual_seed(1234)
    model = Tiny()
    result = finetune_model_task(model, Data(), spec, mode="top", fraction=0.2)
    return result, {k: v.clone() for k, v in model.state_dict().items()}


def _finetune(spec: TrainSpec) -> tuple[FinetuneResult, dict[str, torch.Tensor], str]:
    state = finetune_tiny(spec, return_state=True)
    result, weights = state.result()
    return result, weights, task_states(state.state_details.flow_run_id, {"finetune-model"})["finetune-model"]


def test_a_rerun_of_a_finetuning_is_cached_with_its_weights() -> None:
    spec = TrainSpec(run_key="cached-finetuning", max_epochs=2, patience=9)
    first, tuned, first_state = _finetune(spec)
    assert first_state == "Completed" and first.train.epochs_trained_now == [0, 1]

    again, reloaded, again_state = _finetune(spec)
    assert again_state == "Cached" and again.train.reused_completed and again.freeze == first.freeze
    assert _same(reloaded, tuned)

    fresh, _, fresh_state = _finetune(spec.model_copy(update={"fresh": True}))
    assert fresh_state == "Completed" and fresh.train.epochs_trained_now == [0, 1]
