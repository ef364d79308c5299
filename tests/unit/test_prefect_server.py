"""``make ui``'s Prefect server: a worker heartbeat does not fail when another write lands mid-way.

The CI failure this pins: ``ERROR ... Worker channel heartbeat persistence failed`` with
``sqlite3.OperationalError: database is locked``, logged by ``prefect server start`` while a
worker and ``infra.deploy serve`` ran against it. The heartbeat reads the work pool, then upserts
the worker row, in a DEFERRED transaction; a write committed between the two makes the upsert fail
at once (a stale WAL snapshot ignores the busy timeout). The test commits exactly such a write
from a second SQLite connection between the read and the upsert.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _heartbeat_with_a_write_in_between(db_file: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """One worker heartbeat on a fresh SQLite Prefect database; another connection writes after
    the heartbeat's read. Returns what happened to each."""
    from prefect.server.database import dependencies
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

    # Prefect keeps the first database configuration it builds in this process: start afresh
    monkeypatch.setattr(dependencies, "MODELS_DEPENDENCIES", dict.fromkeys(dependencies.MODELS_DEPENDENCIES))
    seen: dict = {}

    async def go() -> None:
        from prefect.client.schemas.worker_channel import WorkerHeartbeatFrame
        from prefect.server import models
        from prefect.server.database import provide_database_interface
        from prefect.server.schemas.actions import WorkPoolCreate
        from prefect.server.utilities import worker_channel
        from prefect.types._datetime import now

        db = provide_database_interface()
        await db.create_db()
        async with db.session_context(begin_transaction=True) as session:
            await models.workers.create_work_pool(session=session, work_pool=WorkPoolCreate(name="local", type="process"))

        read = models.workers.read_work_pool_by_name

        async def read_then_someone_writes(*args, **kwargs):
            pool = await read(*args, **kwargs)
            other = sqlite3.connect(db_file, timeout=0.3)
            try:
                other.execute("UPDATE work_pool SET description = 'edited meanwhile'")
                other.commit()
                seen["other_write"] = "committed"
            except sqlite3.OperationalError as exc:
                seen["other_write"] = f"waited: {exc}"
            finally:
                other.close()
            return pool

        monkeypatch.setattr(models.workers, "read_work_pool_by_name", read_then_someone_writes)
        frame = WorkerHeartbeatFrame.model_validate({
            "type": "worker.heartbeat.v1", "id": str(uuid.uuid4()), "sent_at": now("UTC").isoformat(),
            "payload": {"consumer_id": str(uuid.uuid4()), "worker_name": "ProcessWorker t",
                        "heartbeat_interval_seconds": 30}})
        try:
            async with db.session_context(begin_transaction=True) as session:
                await worker_channel._persist_worker_channel_heartbeat(
                    session=session, work_pool_name="local", frame=frame)
            seen["heartbeat"] = "persisted"
        except Exception as exc:  # noqa: BLE001 - the failure under test
            seen["heartbeat"] = f"failed: {exc}"
        finally:
            monkeypatch.setattr(models.workers, "read_work_pool_by_name", read)

    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{db_file}"}):
        asyncio.run(go())
    return seen


def test_the_heartbeat_holds_the_write_lock_instead_of_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.server.utilities import worker_channel

    from infra import prefect_server

    monkeypatch.setattr(worker_channel, "_persist_worker_channel_heartbeat",
                        worker_channel._persist_worker_channel_heartbeat)  # undone after the test
    assert prefect_server.immediate_worker_heartbeats()
    assert prefect_server.immediate_worker_heartbeats()  # idempotent
    seen = _heartbeat_with_a_write_in_between(tmp_path / "prefect.db", monkeypatch)
    assert seen["heartbeat"] == "persisted", seen
    # the other writer waited for the heartbeat's lock (its 0.3 s ran out) rather than breaking it
    assert seen["other_write"].startswith("waited"), seen


def test_unpatched_prefect_fails_the_same_heartbeat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproduction: without the fix the heartbeat fails as it did in CI (if a later Prefect
    fixes this itself, this test says so and the wrapper can go)."""
    from prefect.server.utilities import worker_channel

    assert not getattr(worker_channel._persist_worker_channel_heartbeat, "_indusflow_immediate", False)
    seen = _heartbeat_with_a_write_in_between(tmp_path / "prefect.db", monkeypatch)
    assert seen["other_write"] == "committed", seen
    assert seen["heartbeat"].startswith("failed") and "database is locked" in seen["heartbeat"], seen
