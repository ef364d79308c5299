"""Content-addressed materialisation of derived tables (generated data, features).

A derived table is stored once per key (its inputs' hashes + config + code version);
re-running with unchanged inputs reads it back instead of recomputing it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NONE

from infra.home import home_layout
from infra.store import check_name, stable_hash
from tasks.data import DatasetRef, store_table

log = logging.getLogger(__name__)


def materialize_table(
    name: str, key: Mapping[str, Any], build: Callable[[], pd.DataFrame]
) -> DatasetRef:
    """Return the stored table for ``(name, key)``, building and storing it if absent.

    Args:
        name: a short name for the kind of table (``fraud-features``).
        key: everything the table depends on (input hashes, config, code version).
        build: computes the table when it is not stored yet.
    """
    digest = stable_hash(dict(key))
    target = home_layout().prepared() / f"{check_name(name)}-{digest}.parquet"
    meta = target.with_suffix(".json")
    if target.exists() and meta.exists():
        log.info("reusing prepared %s (key %s)", target.name, digest)
        return DatasetRef(**json.loads(meta.read_text()))
    log.info("preparing %s (key %s)", name, digest)
    return store_table(build(), target, key=digest, source=name)


# Cache policy NONE on purpose: the store is content-addressed by ``key`` already.
materialize_table_task = task(
    materialize_table,
    name="materialize-table",
    description="Build a derived table once per content key, reuse it afterwards.",
    cache_policy=NONE,
)
