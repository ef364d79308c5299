"""A team's engines on 127.0.0.1 for the ``servers`` tests: a throwaway PostgreSQL cluster, a
``prefect server start`` backed by it, and ``prefect worker start`` processes, each started in
its own process session and stopped (its whole process group) when the test ends.

PostgreSQL comes from Debian's ``postgresql`` package (``.ci/run`` installs it). Its server
refuses to run as root, so as root (CI, a container) the cluster is made and run as the
``postgres`` system user. pytest-postgresql was not used: its process fixture runs ``pg_ctl`` as
the calling user, which fails as root.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian layout), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def _as_postgres(cmd: list[str]) -> list[str]:
    """``cmd`` run as the postgres system user when we are root (the server refuses root)."""
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


@dataclass
class Postgres:
    port: int
    folder: Path

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``prefect`` database (trust authentication on loopback)."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/prefect"


def _run(cmd: list[str], timeout_s: float) -> None:
    done = subprocess.run(_as_postgres(cmd), check=False, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}: {done.stdout}{done.stderr}"


@contextmanager
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster on a free loopback port with a ``prefect`` database, in a folder of its
    own under the temp folder (as root, owned by the postgres user: a pytest tmp_path's parents
    are closed to it), removed afterwards."""
    bindir = pg_bin()
    assert bindir is not None, "no PostgreSQL (Debian package postgresql; .ci/run installs it)"
    folder = Path(tempfile.mkdtemp(prefix="indusflow-pg-"))
    data, sock = folder / "data", folder / "sock"
    for d in (data, sock):
        d.mkdir()
    if os.geteuid() == 0:
        for d in (folder, data, sock):
            shutil.chown(d, "postgres")
    try:
        _run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
             120)
        port = free_port()
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {sock} -c fsync=off -c max_connections=100"
        _run([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "postgres.log"), "-w",
              "-t", "60", "start"], 90)
        try:
            _run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "prefect"], 60)
            yield Postgres(port=port, folder=folder)
        finally:
            subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                           check=False, capture_output=True, timeout=60)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Proc:
    """A started process (its own session: its pid is its process group) and its log file."""

    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole process group (the process and every child it started)."""
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill_tree(self) -> list[int]:
        """SIGKILL the process and every descendant, in a session of its own or not (a worker's
        flow-run process): all are stopped first, so none sees another die and reacts. Returns
        the descendants' pids."""
        tree = [self.popen.pid, *descendants(self.popen.pid)]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in tree:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        return tree[1:]

    def stop(self, timeout_s: float = 20) -> None:
        if self.popen.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill(signal.SIGKILL)  # children that outlived their parent
        self.popen.wait(10)


def proc_stats() -> dict[int, tuple[str, int, int]]:
    """Every process's (state, parent pid, session id), read from /proc/<pid>/stat (Linux)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
            out[int(stat.parent.name)] = (fields[0], int(fields[1]), int(fields[3]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children...)."""
    children: dict[int, list[int]] = {}
    for child, (_, ppid, _) in proc_stats().items():
        children.setdefault(ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def session_pids(sid: int) -> list[int]:
    """The live processes of session ``sid`` (zombies left out)."""
    return [pid for pid, (state, _, session) in proc_stats().items() if session == sid and state != "Z"]


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start(name: str, cmd: list[str], env: Mapping[str, str], folder: Path, cwd: Path = ROOT) -> Proc:
    """``cmd`` in a new session, output to ``folder/<name>.log``."""
    log = folder / f"{name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen(cmd, env=dict(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    return Proc(name, popen, log)


def base_env(home: Path, prefect_home: Path) -> dict[str, str]:
    """This environment less any Prefect API or indusflow setting the test did not choose."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "INDUSFLOW_"))}
    env.update({"PREFECT_HOME": str(prefect_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PYTHONUNBUFFERED": "1", "INDUSFLOW_HOME": str(home)})
    return env


@contextmanager
def prefect_server(db_url: str, folder: Path, env: Mapping[str, str]) -> Iterator[str]:
    """``prefect server start`` (through ``python -m infra.prefect_server``) on ``db_url``; yields
    its API URL once healthy."""
    port = free_port()
    server_env = {**env, "PREFECT_API_DATABASE_CONNECTION_URL": db_url,
                  "PREFECT_UI_ENABLED": "false",
                  "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
                  "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
                  "PREFECT_SERVER_SERVICES_FOREMAN_ENABLED": "false"}
    proc = start("prefect-server", [sys.executable, "-m", "infra.prefect_server", "--host", "127.0.0.1",
                                    "--port", str(port)], server_env, folder)
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.popen.poll() is None, f"the Prefect server exited:\n{proc.tail()}"
            assert time.monotonic() < deadline, f"the Prefect server did not become healthy:\n{proc.tail()}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        proc.stop()


def wait_for(predicate, what: str, timeout_s: float, every_s: float = 1.0, on_fail=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}\n{on_fail()}"
        time.sleep(every_s)
