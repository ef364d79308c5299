"""Search-space validation: bad ranges and unknown names fail before any trial, named."""

from __future__ import annotations

import pytest

from solutions.fraud.config import SEARCH_SPACE, CategoricalParam, FloatParam, IntParam, SequenceModelConfig
from tasks.tune import SearchSpaceError, validate_space

FIELDS = tuple(SequenceModelConfig.model_fields)


def _make(update: dict) -> SequenceModelConfig:
    return SequenceModelConfig(**update)


def test_fraud_search_space_is_valid() -> None:
    space = validate_space(SEARCH_SPACE, FIELDS, make_config=_make)
    assert {p.name for p in space} == {"lr", "hidden", "mlp_hidden", "dropout", "seq_len", "weight_decay", "loss"}
    defaults = SequenceModelConfig()
    for p in space:  # the default config is inside the space (it is enqueued as trial 0)
        value = getattr(defaults, p.name)
        if p.kind == "categorical":
            assert value in p.choices
        else:
            assert p.low <= value <= p.high


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (FloatParam(name="lr", low=1e-2, high=1e-3, log=True), r"'lr' has low=0.01 >= high=0.001"),
        (FloatParam(name="dropout", low=0.2, high=0.2), r"'dropout' has low=0.2 >= high=0.2"),
        (FloatParam(name="weight_decay", low=0.0, high=1e-2, log=True), r"'weight_decay' is on a log scale but low=0.0"),
        (IntParam(name="hidden", low=-4, high=64, log=True), r"'hidden' is on a log scale"),
        (FloatParam(name="learning_rate", low=1e-4, high=1e-2), r"'learning_rate' is not a field of the config"),
        (CategoricalParam(name="loss", choices=()), r"'loss' has no choices"),
        (CategoricalParam(name="loss", choices=("bce", "hinge")), r"'loss': the config rejects the value 'hinge'"),
        (FloatParam(name="dropout", low=0.0, high=1.5), r"'dropout': the config rejects the value 1.5"),
    ],
)
def test_invalid_space_names_the_parameter(spec, message: str) -> None:
    with pytest.raises(SearchSpaceError, match=message):
        validate_space((*SEARCH_SPACE[:1], spec) if spec.name != "lr" else (spec,), FIELDS, make_config=_make)


def test_duplicate_and_empty_spaces_fail() -> None:
    with pytest.raises(SearchSpaceError, match="'lr' is declared twice"):
        validate_space((SEARCH_SPACE[0], SEARCH_SPACE[0]), FIELDS)
    with pytest.raises(SearchSpaceError, match="empty"):
        validate_space((), FIELDS)
