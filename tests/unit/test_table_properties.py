"""Property-based tests of the table validator: generated frames with bad cells get a
:class:`DataValidationError` naming the column and row, never another exception."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.errors import DataValidationError
from infra.tables import ColumnSpec, TableSchema, validate_table

KINDS = ("float", "int", "datetime", "binary", "id", "category", "str")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Any cell a CSV or Parquet reader (or a careless caller) may hand over.
ANY_CELL = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["", "abc", "2262-04-12", "1600-01-01", "0x1F", "1e400", "-", "NaT",
                                           "2024-01-01T00:00:00+05:00", "2024-13-45", "∞", "１２３"]),
    st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)),
    st.binary(max_size=4), st.decimals(allow_nan=False, places=2),
)


def _good(kind: str, i: int) -> object:
    return {"float": 1.5 * i, "int": i, "datetime": f"2024-01-{1 + i % 28:02d} 10:00", "binary": i % 2,
            "id": f"A{i}", "category": "x", "str": "text"}[kind]


#: A cell that is wrong for the kind, whatever the rest of the column holds.
BAD_CELL = {
    "float": st.sampled_from(["abc", "1,5x", "inf", "--2"]),
    "int": st.sampled_from(["abc", "seven", "-inf"]),
    "datetime": st.sampled_from(["not a date", "2262-04-12", "1500-06-01", "2024-13-45"]),
    "binary": st.sampled_from(["maybe", "2", "-1", "oui"]),
}


@st.composite
def schemas(draw: st.DrawFn) -> TableSchema:
    n = draw(st.integers(1, 4))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n))
    columns = tuple(
        ColumnSpec(name=f"c{i}", kind=k, nullable=draw(st.booleans()),
                   min_value=draw(st.none() | st.floats(-10, 10)) if k in {"float", "int"} else None)
        for i, k in enumerate(kinds)
    )
    return TableSchema(name="t", columns=columns)


@SETTINGS
@given(schema=schemas(), data=st.data())
def test_any_cells_give_a_table_or_a_validation_error(schema: TableSchema, data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 6))
    frame = pd.DataFrame({
        c.name: pd.Series([data.draw(ANY_CELL) for _ in range(rows)], dtype=object) for c in schema.columns
    })
    try:
        table = validate_table(frame, schema, "gen.csv")
    except DataValidationError as exc:
        assert exc.source == "gen.csv" and (exc.column is None or exc.column in frame.columns)
        assert all(0 <= r < rows for r in exc.rows)
        return
    assert list(table.columns) == [c.name for c in schema.columns] and len(table) == rows
    for c in schema.columns:
        if c.kind == "datetime":
            assert str(table[c.name].dtype) == "datetime64[ns]"


@SETTINGS
@given(schema=schemas(), data=st.data())
def test_one_bad_cell_is_named_by_column_and_row(schema: TableSchema, data: st.DataObject) -> None:
    checkable = [c for c in schema.columns if c.kind in BAD_CELL or not c.nullable]
    if not checkable:
        return
    rows = data.draw(st.integers(2, 8))
    frame = pd.DataFrame({
        c.name: pd.Series([_good(c.kind, i + 20) for i in range(rows)], dtype=object) for c in schema.columns
    })
    target = data.draw(st.sampled_from(checkable))
    row = data.draw(st.integers(0, rows - 1))
    bad = data.draw(BAD_CELL[target.kind]) if target.kind in BAD_CELL else None
    frame.loc[row, target.name] = bad if bad is not None else np.nan
    try:
        validate_table(frame, schema, "gen.csv")
    except DataValidationError as exc:
        assert exc.column == target.name and exc.rows == [row], str(exc)
        assert target.name in str(exc) and str(row) in str(exc)
        if isinstance(bad, str) and len(bad) > 2:
            assert repr(bad) not in str(exc)  # the message quotes no cell
        return
    raise AssertionError(f"{bad!r} in {target.kind} column {target.name} row {row} passed validation")
