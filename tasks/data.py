"""Load and validate tables into the artifact store; time-ordered splits.

Plain functions first (unit-testable without Prefect), thin tasks at the bottom.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from prefect import task
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import DataValidationError
from infra.home import home_layout
from infra.store import atomic_path, sha256_file, stable_hash
from infra.tables import TableSchema, describe_columns, read_table, validate_table
from tasks.cache import RESULT_SERIALIZER, stored_table_policy

log = logging.getLogger(__name__)


class DatasetRef(BaseModel):
    """A validated table in the artifact store (Parquet), small enough to pass between tasks."""

    model_config = ConfigDict(frozen=True)

    path: str
    content_hash: str
    n_rows: int
    columns: dict[str, str] = Field(description="column -> dtype")
    source: str

    def read(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """Read the table (or some of its columns) back.

        Raises:
            DataValidationError: the stored file is gone (deleted from the home after a run
                that Prefect's cache now returns).
        """
        if not Path(self.path).exists():
            raise DataValidationError(
                "the stored table is gone from the home folder; run again with PREFECT_TASKS_REFRESH_CACHE=true "
                "to store it anew", source=self.path)
        return pd.read_parquet(self.path, columns=list(columns) if columns else None)


def load_table(
    path: Path,
    schema: TableSchema,
    *,
    columns: Mapping[str, str] | None = None,
    encoding: str | None = None,
) -> DatasetRef:
    """Read, rename (canonical <- source), validate and store a table as Parquet.

    The stored file is content-addressed (source bytes + schema + mapping + a given CSV
    encoding): loading the same file again writes the same Parquet. Inside a flow the task
    skips an unchanged file altogether (Prefect's cache: :func:`tasks.cache.stored_table_policy`).
    A CSV's encoding is detected unless ``encoding`` names it.
    """
    path = Path(path)
    if not path.exists():
        raise DataValidationError("file not found", source=str(path))
    mapping = dict(columns or {})
    key = stable_hash(
        {"file": sha256_file(path), "schema": schema.fingerprint(), "columns": mapping,
         **({"encoding": encoding} if encoding else {})}
    )
    target = home_layout().datasets() / f"{schema.name}-{key}.parquet"
    df = read_table(path, encoding)
    if mapping:
        absent = [src for src in mapping.values() if src not in df.columns]
        if absent:
            raise DataValidationError(
                f"column mapping names {absent}, which the file does not have; "
                f"it has {describe_columns(df.columns)}",
                source=str(path),
                column=absent[0],
            )
        df = df.rename(columns={src: canon for canon, src in mapping.items()})
    table = validate_table(df, schema, source=str(path))
    ref = store_table(table, target, key=key, source=str(path))
    return ref


def store_table(table: pd.DataFrame, target: Path, *, key: str, source: str) -> DatasetRef:
    """Write a validated frame as Parquet, atomically."""
    with atomic_path(target) as tmp:
        table.to_parquet(tmp, index=False)
    ref = DatasetRef(
        path=str(target),
        content_hash=key,
        n_rows=len(table),
        columns={c: str(t) for c, t in table.dtypes.items()},
        source=source,
    )
    log.info("stored %d validated rows of %s as %s", len(table), source, target.name)
    return ref


# --------------------------------------------------------------------------------------
# tasks


load_table_task = task(
    load_table,
    name="load-table",
    description="Read, map, validate and store a CSV/Parquet table (content-addressed); cached while the file is "
    "unchanged.",
    cache_policy=stored_table_policy(),
    result_serializer=RESULT_SERIALIZER,
)
