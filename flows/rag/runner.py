"""``python -m flows.rag.runner PARENT_PID LIMIT NAME...``: Prefect's :class:`~prefect.runner.Runner`
serving the ``rag-ingest`` flow for the knowledge-base API process ``PARENT_PID`` (started by
:mod:`flows.serve.kb_runner`, which explains why) as the deployments ``rag-ingest/NAME`` (one per served
collection), each with a concurrency limit of 1 (Prefect's deployment concurrency, collision strategy
ENQUEUE: a second upload's run waits as ``AwaitingConcurrencySlot`` until the first ends), at most ``LIMIT``
runs at once in all, each in a child process at lower CPU priority; it stops (SIGTERM: the Runner's own
shutdown) when that process is gone.
"""

from __future__ import annotations

import asyncio
import os
import sys

from flows.rag.job import INGEST_NICENESS
from infra.processes import exit_with_parent

#: How often the runner asks the API for runs to start (Prefect's default, 10 s, is most of an upload's wait).
POLL_S = 1.0


async def _serve(limit: int, names: list[str]) -> None:
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.deployments.runner import EntrypointType
    from prefect.runner import Runner

    from flows.rag.ingest import rag_ingest

    runner = Runner(name=f"kb-api-{os.getppid()}", limit=limit, query_seconds=POLL_S, pause_on_shutdown=False)
    one_at_a_time = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)
    for name in names:
        # by module path: each run's child imports the flow (python -m prefect.engine) as a worker's run does
        # (a flow handed over pickled loses the names its postponed annotations need, IngestParams)
        deployment = await rag_ingest.ato_deployment(name=name, tags=["kb-upload"],
                                                     entrypoint_type=EntrypointType.MODULE_PATH,
                                                     concurrency_limit=one_at_a_time)
        await runner.aadd_deployment(deployment)
    await runner.start()


def main(argv: list[str]) -> None:
    """``python -m flows.rag.runner PARENT_PID LIMIT NAME...``."""
    exit_with_parent(int(argv[0]))
    limit = int(argv[1])
    os.nice(INGEST_NICENESS)  # its runs inherit it: the API's requests come first
    asyncio.run(_serve(limit, argv[2:]))


if __name__ == "__main__":
    main(sys.argv[1:])
