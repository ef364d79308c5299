"""Reading tabular files: CSV or Parquet, recognised by content, with named errors.

Shared by the generic load task and the verticals' own readers (``solutions`` may use
``infra``, not ``tasks``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from infra.errors import DataValidationError


def read_table(path: Path) -> pd.DataFrame:
    """Read a CSV or Parquet file, deciding by content (Parquet magic) then by suffix."""
    if not path.exists():
        raise DataValidationError("file not found", source=str(path))
    if path.stat().st_size == 0:
        raise DataValidationError("file is empty (0 bytes)", source=str(path))
    with open(path, "rb") as handle:
        magic = handle.read(4)
    try:
        if magic == b"PAR1":
            return pd.read_parquet(path)
        if path.suffix.lower() in {".parquet", ".pq"}:
            raise DataValidationError("file ends in .parquet but is not Parquet", source=str(path))
        return pd.read_csv(path, low_memory=False)
    except DataValidationError:
        raise
    except pd.errors.EmptyDataError as exc:
        raise DataValidationError("file has no header and no rows", source=str(path)) from exc
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as exc:
        raise DataValidationError(f"cannot be parsed: {exc}", source=str(path)) from exc


def check_column_mapping(columns: Mapping[str, str], canonical: Iterable[str]) -> dict[str, str]:
    """Validate a canonical -> source column mapping; returns a private copy.

    Raises ``ValueError`` naming unknown canonical columns (with the valid names) or source
    columns mapped to more than one canonical column.
    """
    valid = tuple(canonical)
    unknown = [k for k in columns if k not in valid]
    if unknown:
        raise ValueError(
            f"unknown canonical column(s) {unknown} in the column mapping; "
            f"valid canonical names: {', '.join(valid)}"
        )
    sources = list(columns.values())
    dupes = sorted({s for s in sources if sources.count(s) > 1})
    if dupes:
        raise ValueError(
            f"source column(s) {dupes} mapped to more than one canonical column; map each source column once"
        )
    return dict(columns)


def write_table(frame: pd.DataFrame, target: Path, csv: bool = False) -> Path | None:
    """Write ``frame`` as Parquet, and as CSV beside it if asked, each atomically (readers
    never see a half-written file). Returns the CSV's path when one was written."""
    from infra.store import atomic_path

    with atomic_path(target) as tmp:
        frame.to_parquet(tmp, index=False)
    if not csv:
        return None
    csv_path = target.with_suffix(".csv")
    with atomic_path(csv_path) as tmp:
        frame.to_csv(tmp, index=False)
    return csv_path
