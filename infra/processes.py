"""Local child processes started together and stopped together (a federation on one machine).

Each child runs ``python -m MODULE ARGS`` with its output in a log file, in its own process
group so that stopping it stops whatever it started. Nothing here knows what the children do.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self


def exit_with_parent(parent: int, *, grace_s: float | None = None, interval_s: float = 0.5) -> None:
    """Tie this process to ``parent``: exit at once if it is already gone, else a daemon thread sends
    this process SIGTERM once ``parent`` is no longer its parent (it died, even by SIGKILL), and with
    ``grace_s`` exits regardless that long after (a server whose shutdown may hang)."""
    if os.getppid() != parent:  # the parent died before we got here
        sys.exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)
        if grace_s is not None:
            time.sleep(grace_s)
            os._exit(0)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    """One started process and its log."""

    name: str
    proc: subprocess.Popen
    log: Path

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class ProcessGroup:
    """Children of this process; ``stop()`` ends every one still running (SIGTERM, then SIGKILL)."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, module: str, args: Sequence[str], env: dict[str, str] | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def wait(self, main: Child, timeout_s: float, poll: Callable[[], None] | None = None,
             every_s: float = 1.0) -> int:
        """Wait for ``main`` to exit (calling ``poll`` meanwhile); its exit code. Raises
        TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while main.proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{main.name} still running after {timeout_s:.0f} s")
            if poll is not None:
                poll()
            time.sleep(every_s)
        if poll is not None:
            poll()
        return int(main.proc.returncode)

    def stop(self, grace_s: float = 5.0) -> None:
        for child in self.children:
            if child.proc.poll() is None:
                _signal(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(child.proc, signal.SIGKILL)
                child.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def process_alive(pid: int, marker: str | None = None) -> bool:
    """Whether process ``pid`` runs (not a zombie) and, with ``marker``, its command line holds it
    (a recycled pid is another program)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return marker is None
    proc = Path(f"/proc/{pid}")
    if proc.is_dir():
        try:
            if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
            if marker is not None and marker not in proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(
                    "utf-8", "replace"):
                return False
        except (OSError, IndexError):
            return False
    return True
