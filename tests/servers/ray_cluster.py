"""A throwaway Ray cluster for the tests: one ``ray start --head`` node on 127.0.0.1 with 2 CPUs (two
worker processes run tasks side by side), started in a session of its own with its own temp dir,
stopped by killing exactly the processes of that session (``ray stop --force`` kills every Ray
process of the machine it may signal, found by name: other sessions' clusters too). The node's
daemons and workers keep its session (the workers take a process group of their own, so a group
kill would miss them).

Addresses: Ray 2.60 replaces 127.0.0.1 given to ``ray start --node-ip-address`` or ``--address``
(and to ``ray.init``) by the machine's outward address (``services.resolve_ip_for_localhost``;
ray-project/ray#59110), and then listens on every interface. Only a single-node Ray stays on
127.0.0.1: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (tests/conftest.py sets it for the test
process; the node gets it here), which refuses worker nodes. Tests here send traffic to loopback
only, so the cluster is one node and a killed *worker process* stands for a lost worker. Every
port is a free one (no fixed 6379, 8265, 10001, 52365, 44217, 44227).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers.team import free_port, session_pids


def titles(sid: int) -> list[str]:
    """The command lines of a session's processes (a Ray worker shows ``ray::<task>`` while it runs one)."""
    out = []
    for pid in session_pids(sid):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
        except OSError:
            pass
    return out


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (again for any it started meanwhile)."""
    for _ in range(5):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


@dataclass
class RayNode:
    sid: int
    temp_dir: Path

    def kill(self) -> None:
        """kill -9 of the node: its raylet, object store, agents and workers."""
        kill_session(self.sid)

    def wait_gone(self, timeout: float = 30.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while (left := session_pids(self.sid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


@dataclass
class RayCluster:
    address: str
    env: dict[str, str]
    head: RayNode
    workers: list[RayNode] = field(default_factory=list)

    @property
    def nodes(self) -> list[RayNode]:
        return [self.head, *self.workers]

    def stop(self) -> list[int]:
        """Kill every process of the cluster's nodes; return those still alive after 30 s."""
        for node in reversed(self.nodes):
            node.kill()
        return [pid for node in self.nodes for pid in node.wait_gone()]


def _machine_cpus() -> set[int]:
    """The cores this test run may use: a pytest-xdist worker keeps to its share
    (tests/conftest.py), while its parent (the controller, or the shell) holds them all."""
    try:
        return os.sched_getaffinity(os.getppid()) | os.sched_getaffinity(0)
    except OSError:
        return os.sched_getaffinity(0)


def _ray(args: list[str], env: dict[str, str], log: Path) -> int:
    """Run ``ray <args>`` in a new session (its daemons keep it); return the session id.

    The node gets the machine's cores, not the pinned xdist worker's one: a node of 2 CPUs runs two
    worker processes side by side, and its GCS, raylet and agents answer each other's health checks
    and the driver while they run (on one core shared with the test, under load, they starved)."""
    ray = str(Path(sys.executable).with_name("ray"))
    cpus = _machine_cpus()
    with open(log, "wb") as out:
        proc = subprocess.Popen([ray, *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            raise
    if rc != 0:
        kill_session(proc.pid)
        raise RuntimeError(f"ray {args[0]} {args[1]} failed ({rc}):\n{log.read_text()[-3000:]}")
    return proc.pid


def start_cluster(root: Path, extra_env: dict[str, str] | None = None) -> RayCluster:
    """A head node on 127.0.0.1 with 2 CPUs, a 200 MB object store, no dashboard, no usage stats."""
    env = {**os.environ, **(extra_env or {}), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0", "AUTOSCALER_METRIC_PORT": str(free_port()),
           "DASHBOARD_METRIC_PORT": str(free_port())}
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    head_dir = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))  # short: Ray's unix sockets live below it
    head = RayNode(_ray(["start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                         "--object-store-memory=200000000", "--disable-usage-stats", "--include-dashboard=false",
                         f"--temp-dir={head_dir}", f"--ray-client-server-port={free_port()}",
                         f"--dashboard-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                         f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
                         f"--metrics-export-port={free_port()}"], env, root / "head.log"), head_dir)
    cluster = RayCluster(address=f"127.0.0.1:{port}", env=env, head=head)
    try:
        _wait_alive(cluster, root / "status.log")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_alive(cluster: RayCluster, log: Path, timeout_s: float = 180.0) -> None:
    """Until ``ray status`` counts the head node active (its raylet registered with the GCS), so that
    a driver's ``ray.init`` finds a node at once; a node that never comes up fails here, naming it,
    instead of in a test's ``ray.init``."""
    ray = str(Path(sys.executable).with_name("ray"))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done = subprocess.run([ray, "status", f"--address={cluster.address}"], env=cluster.env,
                                  capture_output=True, text=True, timeout=60, check=False)
            out = done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            out = f"ray status timed out: {exc}"
        log.write_text(out)
        if "1 node_" in out and "Active:" in out:
            return
        if time.monotonic() > deadline or not session_pids(cluster.head.sid):
            raise RuntimeError(f"the Ray head at {cluster.address} did not become active in {timeout_s:.0f} s "
                               f"(its logs: {cluster.head.temp_dir}):\n{out[-2000:]}")
        time.sleep(1.0)


def listening_beyond_loopback(sid: int) -> list[str]:
    """The TCP sockets that processes of session ``sid`` listen on at an address other than
    127.0.0.1 (read from /proc: each process's socket inodes against /proc/net/tcp)."""
    inodes: set[str] = set()
    for pid in session_pids(sid):
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            host = local.split(":")[0]
            loopback = (host.endswith("0100007F") and set(host[:-8]) <= {"0", "F"}) or host == "0" * 24 + "01000000"
            if state == "0A" and inode in inodes and not loopback:  # 127.0.0.1, ::ffff:127.0.0.1 or ::1
                out.append(local)
    return out
