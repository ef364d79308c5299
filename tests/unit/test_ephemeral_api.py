"""A command-line flow run killed with SIGKILL leaves no Prefect server behind: its ephemeral API
(a child process Prefect stops only from an atexit handler) exits within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RUN = textwrap.dedent("""
    import time
    from prefect import flow
    from infra.prefect_env import prefect_cli_settings

    @flow
    def long_run():
        print("RUNNING", flush=True)
        time.sleep(300)

    with prefect_cli_settings():
        long_run()
""")


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_the_ephemeral_api_exits_when_its_run_is_killed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(ROOT), INDUSFLOW_HOME=str(tmp_path / "home"))
    proc = subprocess.Popen([sys.executable, "-c", RUN], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 180
        for line in proc.stdout:  # the flow is running: its API server is up
            if "RUNNING" in line or time.monotonic() > deadline:
                break
        servers = [c for c in _children(proc.pid)
                   if "prefect.server.api.server:create_app" in Path(f"/proc/{c}/cmdline").read_bytes().decode(
                       errors="replace")]
        assert len(servers) == 1, "the run's ephemeral API server was not found"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        gone_by = time.monotonic() + 8
        while _alive(servers[0]) and time.monotonic() < gone_by:
            time.sleep(0.2)
        assert not _alive(servers[0]), "the ephemeral API server outlived its killed run"
    finally:
        for pid in [proc.pid, *servers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)
