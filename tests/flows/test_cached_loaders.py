"""A re-run skips the deterministic loaders through Prefect's cache: their task runs show as Cached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from prefect import flow

from infra.tables import ColumnSpec, TableSchema
from tasks.data import DatasetRef, load_table_task
from tasks.prepare import materialize_table_task
from tests.flows.run_states import task_states

SCHEMA = TableSchema(name="cache-test", columns=(ColumnSpec(name="id", kind="id"),
                                                  ColumnSpec(name="amount", kind="float", min_value=0.0)))
EXPECTED = {"load-table", "materialize-table"}


@flow(name="cache-test-load")
def load_and_derive(path: str) -> tuple[DatasetRef, DatasetRef]:
    """Load a table, then derive one from it (keyed by the loaded table's content hash)."""
    ref = load_table_task(Path(path), SCHEMA)
    derived = materialize_table_task("cache-test-derived", {"data": ref.content_hash, "v": "1"},
                                     lambda: ref.read().assign(double=lambda t: t["amount"] * 2))
    return ref, derived


def _write(path: Path, amounts: list[float]) -> None:
    pd.DataFrame({"id": [f"r{i}" for i in range(len(amounts))], "amount": amounts}).to_csv(path, index=False)


def _run(path: Path) -> tuple[tuple[DatasetRef, DatasetRef], dict[str, str]]:
    state = load_and_derive(str(path), return_state=True)
    return state.result(), task_states(state.state_details.flow_run_id, EXPECTED)


def test_a_rerun_on_the_same_file_is_cached_and_a_changed_file_is_not(tmp_path: Path) -> None:
    path = tmp_path / "amounts.csv"
    _write(path, list(np.linspace(1, 10, 12)))
    (ref, derived), first = _run(path)
    assert first == {"load-table": "Completed", "materialize-table": "Completed"}

    (ref_again, derived_again), second = _run(path)
    assert second == {"load-table": "Cached", "materialize-table": "Cached"}
    assert (ref_again, derived_again) == (ref, derived)
    assert derived_again.read()["double"].iloc[-1] == 20.0

    _write(path, [*np.linspace(1, 10, 12), 99.0])  # the file changes: both steps run again
    (ref_changed, derived_changed), third = _run(path)
    assert third == {"load-table": "Completed", "materialize-table": "Completed"}
    assert ref_changed.content_hash != ref.content_hash and ref_changed.n_rows == 13
    assert derived_changed.read()["double"].iloc[-1] == 198.0
