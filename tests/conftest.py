"""Session-wide test set-up: a private home folder and deliberate CPU threads."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest


def _pin_xdist_worker() -> None:
    """A pytest-xdist worker keeps to its share of the cores (gw0 the first, gw1 the second, ...) when
    there are at least as many cores as workers (more workers than cores share them all: make test's
    three on two cores; each test process runs one thread, :func:`_one_thread_per_process`).

    torch sizes its thread pool from the cores a process may use (and so does infra.hardware for
    training): two workers each running two threads on two busy cores made a tiny model's training
    loop 35x slower (4.8 s alone, 166 s beside the suite). Pinned, each worker and the processes it
    starts use one thread per core of its own.
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and count and hasattr(os, "sched_setaffinity")):
        return
    cpus = sorted(os.sched_getaffinity(0))
    count_n = int(count)
    # a worker started in place of a crashed one is numbered on (gw2 of two workers): it takes the
    # share its number modulo the count names (cpus[2::2] was an empty set: an INTERNALERROR ended the run)
    index = int(worker.removeprefix("gw")) % max(count_n, 1)
    if len(cpus) >= count_n > 1:
        os.sched_setaffinity(0, cpus[index::count_n])


def _one_thread_per_process() -> None:
    """torch (OpenMP) and training use one thread in the test process and the processes it starts,
    unless the caller set OMP_NUM_THREADS. The tests' models are tiny, and the tests run servers and
    child processes beside them: tests/flows/test_compress_flow.py's seed ensemble took 276 s (106.9
    CPU-s) with torch's default two threads and 31 s (38.8 CPU-s) with one, side by side at load
    12-17 on 2 cores (bench/results/test_durations_2026-12-06.md). tests/docs runs the pages'
    commands without these two (a new terminal: the project's own thread choice)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("INDUSFLOW_TRAIN_NUM_THREADS", "1")  # infra.hardware.set_cpu_threads in training


def pytest_configure(config: pytest.Config) -> None:
    _pin_xdist_worker()
    _one_thread_per_process()
    # Everything the project writes goes to a throwaway home (never the user's); each pytest-xdist
    # worker makes its own (it inherits the controller's environment, home included).
    inherited = os.environ.get("INDUSFLOW_HOME")
    home = tempfile.mkdtemp(prefix="indusflow-test-home-")
    os.environ["INDUSFLOW_HOME"] = home
    # the results of cached tasks (tasks/cache.py) go beside it, not into the user's Prefect home
    # (nor into the controller's home: a worker would find another worker's cached results there)
    results = os.environ.get("PREFECT_RESULTS_LOCAL_STORAGE_PATH")
    if results is None or (inherited and results == os.path.join(inherited, "prefect-results")):
        os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = os.path.join(home, "prefect-results")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # CLI tests route project loggers to Prefect's API handler; plain-function tests that
    # run after them log outside any flow run, which is fine: no warning for it.
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    # Ray nodes of the tests (tests/servers/ray_cluster.py, a local Ray) listen on 127.0.0.1 only: Ray
    # reads this when it is imported (infra.runners.LOOPBACK_RAY)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


#: The tiers in the order a run starts them: the ones whose files wait longest on servers and processes
#: first, the many short unit files last, where they even out the workers' ends (make test runs the files
#: in this order: --no-loadscope-reorder; xdist's default puts the files with most tests first, which left
#: the servers tier's one long test to run alone on one worker at the end of the run).
TIER_ORDER = ("servers", "flows", "serve", "integration", "docs", "unit")


def _tier_rank(item: pytest.Item) -> int:
    path, here = Path(str(item.path)), Path(__file__).parent
    parts = path.relative_to(here).parts if path.is_relative_to(here) else ()
    return TIER_ORDER.index(parts[0]) if len(parts) > 1 and parts[0] in TIER_ORDER else len(TIER_ORDER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    items.sort(key=_tier_rank)  # stable: each tier's files and tests keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
