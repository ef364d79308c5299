"""A fraud scoring request's rows, validated once: :func:`validate_rows` is the one validator of the
online path (the server, and every caller that applies rows to the online state).

Its rules are the batch path's: the transactions schema (:func:`solutions.fraud.pipeline.transaction_schema`,
what ``fraud score`` validates a file with) and its timestamp parsing (pandas' ISO 8601 parser), plus
the request-only checks of :func:`check_values` (ids are text, bounded in length, valid Unicode).
A request whose every value is of a plain kind (ids and categories as text, numbers as int/float
inside the schema's bounds, labels 0/1/true/false, timestamps as naive ISO 8601 text, each account's
rows in time order) is read column by column without building a DataFrame; any other request is
validated as the batch path validates a file (:func:`infra.tables.validate_table`), which refuses
it naming the column and the rows, or reads its unusual values exactly as a file's.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from infra.tables import ColumnSpec, TableSchema, validate_table
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S

__all__ = ["MAX_ID_CHARS", "Rows", "check_values", "validate_rows"]


#: Longest id (transaction_id, account_id, terminal_id) or category value (channel, category,
#: occupation) a request may carry. Ids are stored in the account's and the terminal's state
#: documents: without a cap one client could grow a terminal's document (and so everyone's
#: latency at that terminal) without bound.
MAX_ID_CHARS = 128
_ID_COLUMNS = (S.TRANSACTION_ID, S.ACCOUNT_ID, S.TERMINAL_ID)
_CHECKED_COLUMNS = (*_ID_COLUMNS, S.CHANNEL, S.CATEGORY, S.OCCUPATION)


def _not_utf8(value: str) -> bool:
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): no store can hold it
        return True
    return False


def _short_ascii_text(values: list[Any]) -> bool:
    """Whether every value is a string (or None) of at most :data:`MAX_ID_CHARS` ASCII characters."""
    text = [v for v in values if v is not None]
    return (all(type(v) is str for v in text) and max(map(len, text), default=0) <= MAX_ID_CHARS
            and "".join(text).isascii())


def check_values(records: Sequence[Mapping[str, Any]],
                 columns: Mapping[str, str] | None = None) -> Sequence[Mapping[str, Any]]:
    """Refuse id and category values that no store can hold or that would grow the state without bound,
    and give every id one type: text.

    Each of transaction_id, account_id, terminal_id, channel, category and occupation (read
    through the column mapping) must be a scalar (not a list or an object), at most
    :data:`MAX_ID_CHARS` characters, and valid Unicode text (no lone surrogate). An id is a
    string; an integer id is canonicalised to its decimal text (``5`` and ``"5"`` are one account,
    as the batch path reads a numeric id column of a file), while a float (``5.0``) or a boolean
    (``true``) id is refused: neither names one account unambiguously.

    Returns:
        ``records``, or a copy whose integer ids are strings.

    Raises:
        DataValidationError: naming the column and the rows (0-based) at fault.
    """
    mapping = dict(columns or {})
    numeric: list[tuple[int, str]] = []  # (row, source column) of integer ids, made text below
    for canonical in _CHECKED_COLUMNS:
        src = mapping.get(canonical, canonical)
        if _short_ascii_text([rec.get(src) for rec in records]):
            continue  # the common case, checked in C: nothing below refuses or changes such a column
        bad: list[int] = []
        problem = ""
        is_id = canonical in _ID_COLUMNS
        for i, rec in enumerate(records):
            value = rec.get(src)
            if value is None:
                continue
            kind = type(value)
            if is_id and kind is int:
                if len(str(value)) > MAX_ID_CHARS:
                    bad.append(i)
                    problem = problem or f"longer than {MAX_ID_CHARS} characters"
                numeric.append((i, src))
                continue
            if is_id and kind in (float, bool):
                bad.append(i)
                problem = problem or (f"must be a string (or an integer), not a {'boolean' if kind is bool else 'float'}"
                                      ": ids are text, so 5, 5.0 and true cannot name three accounts")
                continue
            if kind in (int, float, bool):
                continue
            if kind is not str:
                bad.append(i)
                problem = problem or f"must be a string or a number, not a {type(value).__name__}"
            elif len(value) > MAX_ID_CHARS:
                bad.append(i)
                problem = problem or f"longer than {MAX_ID_CHARS} characters"
            elif _not_utf8(value):
                bad.append(i)
                problem = problem or "not valid Unicode text (a lone surrogate)"
        if bad:
            raise DataValidationError(f"{canonical} {problem}", source="request", column=canonical, rows=bad[:5])
    if not numeric:
        return records
    out = [dict(rec) for rec in records]
    for i, src in numeric:
        out[i][src] = str(out[i][src])
    return out


def _opt_str(value: Any) -> str | None:
    return None if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)) else str(value)


def _opt_float(value: Any) -> float:
    return float("nan") if _opt_str(value) is None else float(value)


@dataclass
class Rows:
    """Validated rows as plain Python lists, extracted once per batch (pandas per row is slow).

    Build with :meth:`from_frame`; :meth:`part` cuts one request's rows out of a batch.
    """

    t_ns: list[int]
    hours: list[int]
    minutes: list[int]
    dows: list[int]
    accounts: list[str]
    terminals: list[str | None]
    amounts: list[float]
    labels: list[float]
    tx_ids: list[str | None]
    channels: list[str | None]
    categories: list[str | None]
    ages: list[float]
    acc_ages: list[float]
    occupations: list[str | None]
    has_terminal: bool

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> Rows:
        """From a validated frame (canonical columns), in row order."""
        def column(name: str) -> list[Any]:
            return frame[name].tolist() if name in frame.columns else [None] * len(frame)

        stamps = pd.DatetimeIndex(frame[S.TIMESTAMP])
        return cls(
            t_ns=frame[S.TIMESTAMP].to_numpy().astype("datetime64[ns]").astype(np.int64).tolist(),
            hours=stamps.hour.tolist(), minutes=stamps.minute.tolist(), dows=stamps.dayofweek.tolist(),
            accounts=[str(a) for a in frame[S.ACCOUNT_ID].tolist()],
            terminals=[_opt_str(t) for t in column(S.TERMINAL_ID)],
            amounts=pd.to_numeric(frame[S.AMOUNT], errors="coerce").astype("float64").tolist(),
            labels=[_opt_float(v) for v in column(S.LABEL)],
            tx_ids=[_opt_str(v) for v in column(S.TRANSACTION_ID)],
            channels=[_opt_str(v) for v in column(S.CHANNEL)],
            categories=[_opt_str(v) for v in column(S.CATEGORY)],
            ages=[_opt_float(v) for v in column(S.AGE)],
            acc_ages=[_opt_float(v) for v in column(S.ACCOUNT_AGE_DAYS)],
            occupations=[_opt_str(v) for v in column(S.OCCUPATION)],
            has_terminal=S.TERMINAL_ID in frame.columns,
        )

    def __len__(self) -> int:
        return len(self.t_ns)

    def part(self, start: int, end: int) -> Rows:
        """Rows ``start:end``."""
        values = {name: getattr(self, name)[start:end] for name in self.__dataclass_fields__ if name != "has_terminal"}
        return Rows(**values, has_terminal=self.has_terminal)

    @classmethod
    def concat(cls, parts: Sequence[Rows]) -> Rows:
        """The rows of ``parts`` one after the other (all with or all without terminals)."""
        if len(parts) == 1:
            return parts[0]
        if len({p.has_terminal for p in parts}) != 1:
            raise ValueError("rows with and without terminals cannot be joined")
        values = {name: [v for p in parts for v in getattr(p, name)]
                  for name in cls.__dataclass_fields__ if name != "has_terminal"}
        return cls(**values, has_terminal=parts[0].has_terminal)


@functools.lru_cache(maxsize=8)
def request_schema(max_amount: float = P.MAX_AMOUNT) -> TableSchema:
    """The transactions schema of a scoring request: the batch path's, one row at least (frozen: built
    once per bound)."""
    return P.transaction_schema(for_scoring=True, max_amount=max_amount).model_copy(update={"min_rows": 1})


def validate_rows(records: Sequence[Mapping[str, Any]], columns: Mapping[str, str] | None = None, *,
                  max_amount: float = P.MAX_AMOUNT) -> Rows:
    """Request rows -> validated :class:`Rows`, by the batch path's rules (see the module docstring).

    Args:
        records: one mapping per transaction (source column names).
        columns: the column mapping canonical -> source (as ``--columns`` of ``score``).
        max_amount: the largest amount accepted (:func:`~solutions.fraud.pipeline.transaction_schema`).

    Raises:
        DataValidationError: naming the column and the rows (0-based) at fault, or rows of
            one account out of time order.
    """
    records = check_values(records, columns)
    schema = request_schema(max_amount)
    rows = _plain_rows(records, columns, schema)
    if rows is not None:
        return rows
    frame = S.ColumnMapping(dict(columns or {})).apply(pd.DataFrame.from_records(list(records)))
    table = validate_table(frame, schema, source="request")
    ts = table[S.TIMESTAMP]
    back = (ts < ts.groupby(table[S.ACCOUNT_ID], sort=False).shift(1)).to_numpy()
    if back.any():
        raise DataValidationError(
            "rows of one account must be in time order (the online state applies them in order)",
            source="request", column=S.TIMESTAMP, rows=[int(i) for i in np.flatnonzero(back)[:5]],
        )
    return Rows.from_frame(table)


def _sources(records: Sequence[Mapping[str, Any]], columns: Mapping[str, str] | None,
             schema: TableSchema) -> dict[str, str] | None:
    """Canonical -> source column name, or None when the mapping needs the table validation to sort it
    out (it renames onto a canonical name, names a column no record has, or both names are present)."""
    names = [spec.name for spec in schema.columns]
    source = {c: c for c in names}
    if not columns:
        return source
    try:
        mapping = S.ColumnMapping(dict(columns)).columns
    except ValueError:
        return None
    if any(src in source and src != canonical for canonical, src in mapping.items()):
        return None
    present = set().union(*(r.keys() for r in records))
    if any(src not in present or (canonical != src and canonical in present) for canonical, src in mapping.items()):
        return None
    source.update(mapping)
    return source


def _plain_text(values: list[Any], spec: ColumnSpec) -> list[str | None] | None:
    """Ids and categories: text (None where the schema allows a missing value)."""
    for v in values:
        if type(v) is not str and not (v is None and spec.nullable):
            return None
    return values


def _plain_floats(values: list[Any], spec: ColumnSpec, accept: Callable[[Any, type], bool]) -> list[float] | None:
    """The values as floats where ``accept(value, type(value))`` holds for each (NaN for a missing
    value the schema allows); None when one is refused."""
    out: list[float] = []
    for v in values:
        kind = type(v)
        if v is None or (kind is float and math.isnan(v)):
            if not spec.nullable:
                return None
            out.append(math.nan)
        elif accept(v, kind):
            out.append(float(v))
        else:
            return None
    return out


def _plain_number(values: list[Any], spec: ColumnSpec) -> list[float] | None:
    """Numbers: int/float inside the schema's bounds."""
    low = -math.inf if spec.min_value is None else spec.min_value
    bound = math.inf if spec.max_abs is None else spec.max_abs
    kinds = set(map(type, values))
    if kinds <= {float} or (kinds <= {float, int} and bound < 2**53 and  # the rules below, on an array
                            max(map(abs, values)) < 2**53):
        numbers = np.array(values, dtype=np.float64)
        known = ~np.isnan(numbers)
        if not (spec.nullable or known.all()):
            return None
        inside = (low <= numbers) & (-bound <= numbers) & (numbers <= bound)  # an int within the bound is exact
        return numbers.tolist() if bool(np.all(inside | ~known)) else None
    return _plain_floats(values, spec, lambda v, kind: (kind is float or (kind is int and -(2**53) < v < 2**53))
                         and low <= v and -bound <= v <= bound)


def _plain_label(values: list[Any], spec: ColumnSpec) -> list[float] | None:
    """Labels: booleans or the numbers 0 and 1 (NaN when unknown)."""
    return _plain_floats(values, spec, lambda v, kind: kind is bool or ((kind is int or kind is float) and v in (0, 1)))


#: Naive ISO 8601 timestamps that numpy's parser reads exactly as pandas' ISO 8601 parser (both refuse a
#: day or time that does not exist; the years keep inside the ns range): read by numpy, 1.6 us for a
#: one-row request against pandas' 178 us (and no slower at 256 rows). Any other text goes to pandas.
_NUMPY_TIME = re.compile(r"(?:1[7-9]|2[01])\d\d-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d{1,9})?)?")


def _plain_times(values: list[Any]) -> np.ndarray | None:
    """Timestamps: naive ISO 8601 text, parsed as the batch path parses it (pandas): ns since the epoch."""
    if any(type(v) is not str for v in values):
        return None
    if all(map(_NUMPY_TIME.fullmatch, values)):
        try:
            return np.array(values, dtype="datetime64[ns]").view(np.int64)
        except ValueError:  # a day or time that does not exist: pandas' reading decides (it refuses it too)
            pass
    try:  # errors="coerce" still raises for mixed time zones
        stamps = pd.to_datetime(pd.Index(values, dtype=object), format="ISO8601", errors="coerce")
        if stamps.tz is not None or stamps.hasnans:
            return None
        return stamps.as_unit("ns").asi8
    except (ValueError, TypeError, OverflowError, pd.errors.OutOfBoundsDatetime):
        return None


_NS_PER_MINUTE = 60 * 10**9
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (Monday 0)


def _naive_clock(t_ns: np.ndarray) -> tuple[list[int], list[int], list[int]]:
    """Hour, minute and weekday (Monday 0) of naive timestamps (int64 ns): pandas' ``hour``,
    ``minute`` and ``day_of_week`` by the same floor arithmetic, without their fixed cost per call
    (~0.1 ms each: a third of a one-row request's validation)."""
    minutes = t_ns // _NS_PER_MINUTE
    days = minutes // (24 * 60)
    return ((minutes // 60) % 24).tolist(), (minutes % 60).tolist(), ((days + _EPOCH_WEEKDAY) % 7).tolist()


_PLAIN = {"id": _plain_text, "category": _plain_text, "str": _plain_text, "float": _plain_number,
          "int": _plain_number, "binary": _plain_label}


def _plain_rows(records: Sequence[Mapping[str, Any]], columns: Mapping[str, str] | None,
                schema: TableSchema) -> Rows | None:
    """:class:`Rows` read column by column when every value is plain (see the module docstring); None:
    the table validation decides."""
    source = _sources(records, columns, schema) if records else None
    if source is None:
        return None
    values: dict[str, Any] = {}
    for spec in schema.columns:
        src = source[spec.name]
        column = [rec.get(src) for rec in records]
        if spec.name == S.TERMINAL_ID:
            values["has_terminal"] = any(src in rec for rec in records)
        read = _plain_times(column) if spec.kind == "datetime" else _PLAIN[spec.kind](column, spec)
        if read is None:
            return None
        values[spec.name] = read
    stamps: np.ndarray = values[S.TIMESTAMP]
    hours, minutes, dows = _naive_clock(stamps)
    t_ns = stamps.tolist()
    last: dict[str, int] = {}
    for acct, t in zip(values[S.ACCOUNT_ID], t_ns, strict=True):
        if last.get(acct, t) > t:
            return None  # out of time order: the table validation names the rows
        last[acct] = t
    return Rows(t_ns=t_ns, hours=hours, minutes=minutes, dows=dows, accounts=values[S.ACCOUNT_ID], terminals=values[S.TERMINAL_ID],
                amounts=values[S.AMOUNT], labels=values[S.LABEL], tx_ids=values[S.TRANSACTION_ID],
                channels=values[S.CHANNEL], categories=values[S.CATEGORY], ages=values[S.AGE],
                acc_ages=values[S.ACCOUNT_AGE_DAYS], occupations=values[S.OCCUPATION],
                has_terminal=values["has_terminal"])
