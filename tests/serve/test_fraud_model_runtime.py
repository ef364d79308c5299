"""The served fraud network's runtime: ONNX Runtime where it can run it (issue 47's model-path
decision), torch eager where it cannot, with the reason logged once."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from flows.serve import fraud as serve_fraud
from infra.home import HomeLayout
from infra.registry import ModelRegistry
from solutions.fraud import online_model as OM
from tests.serve.fraud_helpers import TinyFraud, train_tiny_fraud


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[HomeLayout, TinyFraud]:
    layout = HomeLayout(tmp_path_factory.mktemp("runtime") / "home")
    return layout, train_tiny_fraud(layout)


@pytest.fixture
def said() -> Iterator[list[str]]:
    """The module logger's warnings, each emission once: a handler on the logger itself (pytest's caplog
    sits on the root and, in the whole suite, received each record twice through the project's handlers)."""
    lines: list[str] = []

    class _Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger, handler = logging.getLogger(OM.__name__), _Said(logging.WARNING)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _load(tiny: tuple[HomeLayout, TinyFraud]) -> OM.OnlineFraudModel:
    layout, data = tiny

    class _Services:
        registry = ModelRegistry(layout.registry())

    return serve_fraud.load_online_model(data.ref, _Services())  # type: ignore[arg-type]


def test_the_served_network_runs_on_onnx_runtime_with_eagers_scores(tiny: tuple[HomeLayout, TinyFraud]) -> None:
    model = _load(tiny)
    assert model.runtime is not None and model.preprocessor is not None
    for rows in (1, 3, 40):  # the batch axis is dynamic
        batch = OM.example_batch(model.preprocessor, model.seq_len, rows=rows)
        onnx = model.network_probabilities(batch)
        eager = replace(model, runtime=None).network_probabilities(batch)
        assert onnx.shape == (rows,) and onnx.dtype == np.float64
        assert np.max(np.abs(onnx - eager)) <= OM.ONNX_TOLERANCE


def test_without_onnxruntime_the_network_runs_eagerly_said_once(tiny: tuple[HomeLayout, TinyFraud],
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 said: list[str]) -> None:
    monkeypatch.setattr(OM, "_told", set())
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    first, second = _load(tiny), _load(tiny)
    assert first.runtime is None and second.runtime is None
    assert len(said) == 1 and "onnxruntime is not installed" in said[0], said
    assert first.predict([]).shape == (0,)


def test_a_failed_export_leaves_the_network_in_eager_said_once(tiny: tuple[HomeLayout, TinyFraud],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               said: list[str], tmp_path: Path) -> None:
    import infra.onnx

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unsupported operator\nmore detail")

    monkeypatch.setattr(OM, "_told", set())
    monkeypatch.setattr(infra.onnx, "export_onnx", broken)
    models = [_load(tiny), _load(tiny)]
    assert all(m.runtime is None for m in models)
    assert said == ["the fraud network runs in torch eager: its ONNX export failed (RuntimeError: unsupported "
                    "operator)"], said
