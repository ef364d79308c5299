"""The project's Prefect defaults for command-line runs (no API is started here)."""

from __future__ import annotations

import pytest
from prefect.settings import get_current_settings

from infra.prefect_env import prefect_cli_settings


@pytest.fixture(autouse=True)
def _no_user_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY",
                 "INDUSFLOW_PREFECT_FLOW_HEARTBEAT_S"):
        monkeypatch.delenv(name, raising=False)


def test_flow_heartbeats_are_off_by_default_on_when_configured_and_prefects_own_variable_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = get_current_settings().flows.heartbeat_frequency
    assert before is not None  # Prefect's default: a heartbeat thread every flow run joins at its end
    with prefect_cli_settings():
        assert get_current_settings().flows.heartbeat_frequency is None
    assert get_current_settings().flows.heartbeat_frequency == before
    monkeypatch.setenv("INDUSFLOW_PREFECT_FLOW_HEARTBEAT_S", "60")
    with prefect_cli_settings():
        assert get_current_settings().flows.heartbeat_frequency == 60
    monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", str(before))  # the user's own setting: untouched
    with prefect_cli_settings():
        assert get_current_settings().flows.heartbeat_frequency == before
