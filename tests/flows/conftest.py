"""Fixtures for flow tests: one temporary Prefect server for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def prefect_harness() -> Iterator[None]:
    """Run every flow test against a throwaway Prefect server and SQLite database.

    The server subprocess takes ~25 s to start, so it is shared by the session.
    """
    with pytest.MonkeyPatch.context() as mp:
        # Set before the server subprocess starts so it inherits them.
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        mp.setenv("PREFECT_SERVER_UI_ENABLED", "false")

        # Prefect configures its logging when ``prefect.main`` is first imported (``from prefect import
        # flow``), and its console handler keeps the sys.stderr of that moment: imported inside a
        # test (a CLI importing its flow lazily), that is the test's capsys stream, closed when the
        # test ends, and the next test's flow run fails writing to it. Import it here, under pytest's
        # own capture.
        import prefect.main  # noqa: F401
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=120):
            yield
