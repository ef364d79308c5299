"""The circuit breaker's states (fake clock) and a model slot that keeps serving when a new version fails to load."""

from __future__ import annotations

import pytest
import torch

from infra.errors import DataValidationError
from infra.registry import ModelRegistry
from infra.serving.breaker import BreakerOpen, CircuitBreaker
from infra.serving.metrics import ServingMetrics
from infra.serving.slot import ModelNotReady, ModelSlot


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fail(breaker: CircuitBreaker) -> None:
    with pytest.raises(RuntimeError), breaker.guard():
        raise RuntimeError("boom")


def test_breaker_opens_half_opens_and_closes() -> None:
    clock = Clock()
    changes: list[bool] = []
    breaker = CircuitBreaker("m", error_share=0.6, window_s=10, min_calls=4, cooldown_s=5,
                             on_change=changes.append, clock=clock)
    with breaker.guard():
        pass
    for _ in range(2):
        _fail(breaker)
    with pytest.raises(DataValidationError), breaker.guard():  # the caller's fault: counted as a success
        raise DataValidationError("bad row")
    assert not breaker.is_open  # 2 of 4 failed: under 60 %
    _fail(breaker)
    assert breaker.is_open and changes == [True]
    with pytest.raises(BreakerOpen) as info:
        breaker.before_call()
    assert "3 of the last 5 model calls failed (last error: RuntimeError)" in info.value.reason
    clock.now += 5.1
    _fail(breaker)  # the trial call fails: open again for a full cool-down
    assert breaker.is_open and breaker.retry_after() == 5
    clock.now += 5.1
    breaker.before_call()  # one trial call passes ...
    with pytest.raises(BreakerOpen):
        breaker.before_call()  # ... and only one
    breaker.record(True)
    assert not breaker.is_open and changes == [True, False]


def test_old_calls_leave_the_window() -> None:
    clock = Clock()
    breaker = CircuitBreaker("m", error_share=0.5, window_s=10, min_calls=4, cooldown_s=5, clock=clock)
    for _ in range(3):
        _fail(breaker)
    clock.now += 11
    for _ in range(3):
        with breaker.guard():
            pass
    _fail(breaker)
    assert not breaker.is_open  # 1 of 4 in the window


def test_slot_keeps_the_old_version_when_a_new_one_fails(tmp_path) -> None:
    registry = ModelRegistry(tmp_path)
    v1 = registry.register("m", {"w": torch.ones(2)}, params={"ok": True}, metrics={"x": 1}, primary_metric="x")
    v2 = registry.register("m", {"w": torch.ones(2)}, params={"ok": False}, metrics={"x": 2}, primary_metric="x")

    def loader(ref):
        if not ref.params["ok"]:
            raise ValueError("corrupt version")
        return ref.version * 10

    metrics = ServingMetrics()
    slot = ModelSlot("m", loader, registry=registry, metrics=metrics)
    with pytest.raises(ModelNotReady):
        slot.current()
    assert not slot.check_now() and "no m@champion" in slot.last_error
    registry.set_alias("m", "champion", v1.version)
    assert slot.check_now() and slot.current()[1] == 10 and slot.ready
    registry.set_alias("m", "champion", v2.version)
    assert not slot.check_now() and not slot.check_now()
    ref, model = slot.current()
    assert (ref.version, model) == (1, 10) and "loading version 2 failed" in slot.last_error
    sample = metrics.registry.get_sample_value
    assert sample("indusflow_model_errors_total", {"model": "m", "stage": "load"}) == 1  # counted once
    assert sample("indusflow_model_version", {"model": "m"}) == 1


def test_two_slots_never_load_at_the_same_time(tmp_path) -> None:
    """Loaders import torch/sklearn on first use; two at once can get partially initialised modules."""
    import threading
    import time

    registry = ModelRegistry(tmp_path)
    for name in ("a", "b", "c"):
        v = registry.register(name, {"w": torch.ones(1)}, params={}, metrics={"x": 1}, primary_metric="x")
        registry.set_alias(name, "champion", v.version)
    inside, most = [0], [0]
    guard = threading.Lock()

    def loader(ref):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.2)
        with guard:
            inside[0] -= 1
        return ref.version

    slots = [ModelSlot(name, loader, registry=registry, poll_s=0.05) for name in ("a", "b", "c")]
    for slot in slots:
        slot.start()
    deadline = time.monotonic() + 10
    while not all(s.ready for s in slots) and time.monotonic() < deadline:
        time.sleep(0.02)
    for slot in slots:
        slot.stop()
    assert all(s.ready for s in slots)
    assert most[0] == 1
