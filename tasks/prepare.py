"""Content-addressed materialisation of derived tables (generated data, features).

A derived table is stored under its key (its inputs' hashes + config + code version); inside a
flow the task is skipped while the key is unchanged (Prefect's cache: the run shows as Cached).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd
from prefect import task

from infra.home import home_layout
from infra.store import check_name, stable_hash
from tasks.cache import RESULT_SERIALIZER, stored_table_policy
from tasks.data import DatasetRef, store_table

log = logging.getLogger(__name__)


def materialize_table(
    name: str, key: Mapping[str, Any], build: Callable[[], pd.DataFrame]
) -> DatasetRef:
    """Build the table of ``(name, key)`` and store it under that key.

    Args:
        name: a short name for the kind of table (``fraud-features``).
        key: everything the table depends on (input hashes, config, code version).
        build: computes the table.
    """
    digest = stable_hash(dict(key))
    target = home_layout().prepared() / f"{check_name(name)}-{digest}.parquet"
    log.info("preparing %s (key %s)", name, digest)
    return store_table(build(), target, key=digest, source=name)


# ``build`` is left out of the cache key: ``key`` describes everything the table depends on
materialize_table_task = task(
    materialize_table,
    name="materialize-table",
    description="Build and store a derived table under its content key; cached while the key is unchanged.",
    cache_policy=stored_table_policy("build"),
    result_serializer=RESULT_SERIALIZER,
)
