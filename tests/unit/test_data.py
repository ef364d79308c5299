"""Loading, validation and time splits of tables (no Prefect)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.errors import DataValidationError, PathEscapeError
from infra.store import safe_join
from infra.tables import ColumnSpec, TableSchema, assign_periods, time_split
from tasks.data import load_table

SCHEMA = TableSchema(
    name="t",
    columns=(
        ColumnSpec(name="id", kind="id"),
        ColumnSpec(name="ts", kind="datetime"),
        ColumnSpec(name="amount", kind="float", min_value=0.0),
        ColumnSpec(name="label", kind="binary"),
        ColumnSpec(name="note", kind="str", required=False, nullable=True),
    ),
    time_column="ts",
    label_column="label",
)


def _frame(n: int = 20) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [f"t{i}" for i in range(n)],
            "ts": pd.date_range("2025-01-01", periods=n, freq="h").astype(str),
            "amount": np.linspace(1, 100, n),
            "label": [i % 5 == 0 for i in range(n)],
        }
    )


def test_csv_and_parquet_load_to_the_same_typed_table(tmp_path: Path) -> None:
    df = _frame()
    df.to_csv(tmp_path / "a.csv", index=False)
    df.to_parquet(tmp_path / "a.parquet", index=False)
    a = load_table(tmp_path / "a.csv", SCHEMA)
    b = load_table(tmp_path / "a.parquet", SCHEMA)
    assert a.n_rows == b.n_rows == 20
    ta, tb = a.read(), b.read()
    assert str(ta["ts"].dtype) == "datetime64[ns]"
    assert ta["label"].tolist() == tb["label"].tolist() == [int(i % 5 == 0) for i in range(20)]
    assert a.columns["amount"] == "float64"


def test_mapping_renames_and_the_store_is_content_addressed(tmp_path: Path) -> None:
    df = _frame().rename(columns={"amount": "TX_AMOUNT"})
    path = tmp_path / "m.csv"
    df.to_csv(path, index=False)
    first = load_table(path, SCHEMA, columns={"amount": "TX_AMOUNT"})
    assert first.read()["amount"].iloc[-1] == 100.0
    # the same file loads to the same stored table (skipping it is Prefect's cache: tests/flows)
    assert load_table(path, SCHEMA, columns={"amount": "TX_AMOUNT"}) == first
    # a changed file gets a new content hash
    df.loc[0, "TX_AMOUNT"] = 999.0
    df.to_csv(path, index=False)
    assert load_table(path, SCHEMA, columns={"amount": "TX_AMOUNT"}).content_hash != first.content_hash


@pytest.mark.parametrize(
    ("mutate", "column", "rows", "text"),
    [
        (lambda d: d.drop(columns=["amount"]), "amount", [], "missing required column"),
        (lambda d: d.assign(amount=d["amount"].astype(object).where(d.index != 3, "abc")), "amount", [3], "non-numeric"),
        (lambda d: d.assign(ts=d["ts"].where(d.index != 7, "not a date")), "ts", [7], "unparseable timestamp"),
        (lambda d: d.assign(label=0), "label", [], "all one class"),
        (lambda d: d.assign(label=d["label"].astype(object).where(d.index != 2, "maybe")), "label", [2], "not a binary label"),
        (lambda d: d.assign(amount=d["amount"].where(d.index != 4, -5.0)), "amount", [4], "below the minimum"),
        (lambda d: d.assign(id=d["id"].where(d.index != 9, None)), "id", [9], "empty value"),
    ],
)
def test_validation_errors_name_file_column_and_rows(tmp_path: Path, mutate, column, rows, text) -> None:
    path = tmp_path / "bad.csv"
    mutate(_frame()).to_csv(path, index=False)
    with pytest.raises(DataValidationError) as info:
        load_table(path, SCHEMA)
    err = info.value
    assert str(path) in str(err) and text in str(err)
    assert err.column == column
    assert err.rows[: len(rows)] == rows


def test_empty_and_header_only_files_are_rejected(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataValidationError, match="empty"):
        load_table(empty, SCHEMA)
    header = tmp_path / "header.csv"
    header.write_text("id,ts,amount,label\n")
    with pytest.raises(DataValidationError, match="rows"):
        load_table(header, SCHEMA)


def test_unknown_mapped_source_column(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    _frame().to_csv(path, index=False)
    with pytest.raises(DataValidationError, match="NOPE"):
        load_table(path, SCHEMA, columns={"amount": "NOPE"})


def test_time_split_is_ordered_and_counts_back_from_the_end() -> None:
    ts = pd.Series(pd.date_range("2025-01-01", "2025-02-28 23:00", freq="h"))
    split = time_split(ts, train_days=14, val_days=3, delay_days=7, test_days=7)
    assert split.end == pd.Timestamp("2025-03-01")
    assert split.test_start == pd.Timestamp("2025-02-22")
    assert split.train_end == pd.Timestamp("2025-02-15")
    periods = assign_periods(ts, split)
    order = {"history": 0, "train": 1, "val": 2, "delay": 3, "test": 4}
    ranks = np.array([order[p] for p in periods])
    assert (np.diff(ranks) >= 0).all(), "periods must follow time: no future before past"
    assert set(periods) == set(order)
    assert (periods == "test").sum() == 7 * 24


def test_time_split_rejects_too_short_data() -> None:
    ts = pd.Series(pd.date_range("2025-01-01", periods=10, freq="D"))
    with pytest.raises(DataValidationError, match="spans"):
        time_split(ts, train_days=14, delay_days=7, test_days=7)


def test_safe_join_refuses_escapes(tmp_path: Path) -> None:
    assert safe_join(tmp_path, "a", "b") == (tmp_path / "a" / "b").resolve()
    with pytest.raises(PathEscapeError):
        safe_join(tmp_path, "..", "etc")
    with pytest.raises(PathEscapeError):
        safe_join(tmp_path, "/etc/passwd")


def test_a_stored_table_gone_from_the_home_says_how_to_store_it_again(tmp_path: Path) -> None:
    path = tmp_path / "g.csv"
    _frame().to_csv(path, index=False)
    ref = load_table(path, SCHEMA)
    Path(ref.path).unlink()
    with pytest.raises(DataValidationError, match="PREFECT_TASKS_REFRESH_CACHE=true"):
        ref.read()
