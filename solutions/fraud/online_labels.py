"""Labels that arrive after scoring (chargebacks, investigations): recorded in the online state, where
the delayed terminal windows of later transactions read them, as the batch path reads a label present
in its file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from infra.tables import validate_table
from solutions.fraud import schema as S
from solutions.fraud.online_state import OnlineFraudState
from solutions.fraud.request_rows import check_values

__all__ = ["apply_labels"]


def apply_labels(state: OnlineFraudState, records: Sequence[Mapping[str, Any]],
                 columns: Mapping[str, str] | None = None) -> list[str]:
    """Record labels that became known after scoring (the delayed terminal risk reads them).

    A label counts for later transactions exactly as a label present in the scored row
    does in the batch path: in the terminal windows ``[t - delay - w, t - delay)``.

    Args:
        state: the online state.
        records: rows with transaction_id, terminal_id, timestamp (as scored) and label.
        columns: the column mapping canonical -> source.

    Returns:
        The transaction ids not found in the state (never scored, or older than the
        terminal windows keep).

    Raises:
        DataValidationError: a column is missing or a value cannot be read (names it).
    """
    records = check_values(records, columns)
    frame = S.ColumnMapping(dict(columns or {})).apply(pd.DataFrame.from_records(list(records)))
    table = validate_table(frame, S.labels_schema(placed=True), source="request")
    t_ns = table[S.TIMESTAMP].to_numpy().astype("datetime64[ns]").astype(np.int64).tolist()
    terminals = [str(t) for t in table[S.TERMINAL_ID].tolist()]
    missing: list[str] = []
    with state.update() as batch:
        batch.load([], terminals)
        for tx, term, t, label in zip(table[S.TRANSACTION_ID].tolist(), terminals, t_ns,
                                      table[S.LABEL].tolist(), strict=True):
            if not batch.record_label(term, str(tx), t, label):
                missing.append(str(tx))
    return missing
