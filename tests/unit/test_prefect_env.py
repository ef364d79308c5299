"""The project's Prefect defaults for command-line runs (no API is started here)."""

from __future__ import annotations

import pytest
from prefect.settings import get_current_settings

from infra import prefect_env
from infra.prefect_env import prefect_cli_settings


@pytest.fixture(autouse=True)
def _no_user_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefect_env, "start_temporary_api", lambda: None)  # settings only: no server
    for name in ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY"):
        monkeypatch.delenv(name, raising=False)


def test_flow_heartbeats_are_off_by_default_and_prefects_own_variable_turns_them_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = get_current_settings().flows.heartbeat_frequency
    assert before is not None  # Prefect's default: a heartbeat thread every flow run joins at its end
    with prefect_cli_settings():
        assert get_current_settings().flows.heartbeat_frequency is None
    assert get_current_settings().flows.heartbeat_frequency == before
    monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "60")  # the user's own setting: untouched
    with prefect_cli_settings():
        assert get_current_settings().flows.heartbeat_frequency == 60
