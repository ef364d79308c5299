"""Session-wide test set-up: a private home folder and deliberate CPU threads."""

from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Everything the project writes goes to a throwaway home (never the user's).
    home = tempfile.mkdtemp(prefix="indusflow-test-home-")
    os.environ["INDUSFLOW_HOME"] = home
    # the results of cached tasks (tasks/cache.py) go beside it, not into the user's Prefect home
    os.environ.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", os.path.join(home, "prefect-results"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # CLI tests route project loggers to Prefect's API handler; plain-function tests that
    # run after them log outside any flow run, which is fine: no warning for it.
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    # Ray nodes of the tests (tests/servers/ray_cluster.py, a local Ray) listen on 127.0.0.1 only: Ray
    # reads this when it is imported (infra.runners.LOOPBACK_RAY)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
