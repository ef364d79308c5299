"""The one request validator (``validate_rows``) reads a plain request column by column with exactly
the values of the batch path's table validation (``validate_table`` with the transactions schema),
and leaves every other request to it: for valid requests the two readings agree value for value,
and every request the table validation refuses is refused with its error. Plain requests never
reach the table validation. Plus: a transaction id twice in one request is refused (409)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random
from typing import Any

import pandas as pd
import pytest

from infra.errors import DataValidationError
from infra.online_state.rocks import RocksStateStore
from solutions.fraud import request_rows
from solutions.fraud.online import (
    ACCOUNT,
    OnlineFraudState,
    OrderError,
    Rows,
    validate_rows,
)

GOOD = {"transaction_id": "t1", "account_id": "A1", "timestamp": "2025-03-01T10:15:30", "amount": 12.5,
        "terminal_id": "T9", "channel": "pos", "category": "grocery", "age": 41, "occupation": "teacher",
        "account_age_days": 830.0}


def _plain(rows: Rows) -> dict[str, Any]:
    """Rows as comparable plain values (NaN -> a marker, since NaN != NaN)."""
    def fix(v: Any) -> Any:
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    return {k: [fix(x) for x in v] if isinstance(v, list) else v for k, v in dataclasses.asdict(rows).items()}


_TABLE_CALLS: list[int] = []  # one entry per table validation


@pytest.fixture(autouse=True)
def _count_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    validate = request_rows.validate_table

    def counted(*args: Any, **kwargs: Any) -> Any:
        _TABLE_CALLS.append(1)
        return validate(*args, **kwargs)

    monkeypatch.setattr(request_rows, "validate_table", counted)


def _read(records: list[dict[str, Any]], columns: dict[str, str] | None,
          table_only: bool = False) -> tuple[Rows | Exception, bool]:
    """``validate_rows``'s answer, and whether it read the request as plain values; with ``table_only``,
    the answer of the batch path's table validation alone."""
    before = len(_TABLE_CALLS)
    with pytest.MonkeyPatch.context() as patch:
        if table_only:
            patch.setattr(request_rows, "_plain_rows", lambda *args: None)
        try:
            rows: Rows | Exception = validate_rows(records, columns)
        except (DataValidationError, ValueError) as exc:
            rows = exc
    return rows, len(_TABLE_CALLS) == before


def _agree(records: list[dict[str, Any]], columns: dict[str, str] | None = None) -> Rows | None:
    """The validator's rows when it read them as plain values (None: the table validation read them)."""
    rows, plain = _read(records, columns)
    general, _ = _read(records, columns, table_only=True)
    if isinstance(general, Exception):
        assert isinstance(rows, Exception) and str(rows) == str(general), (records, rows, general)
        return None
    assert not isinstance(rows, Exception), (records, rows)
    assert _plain(rows) == _plain(general), records
    return rows if plain else None


def test_valid_requests_are_read_as_plain_values_with_the_table_validations_values() -> None:
    cases: list[tuple[list[dict[str, Any]], dict[str, str] | None]] = [
        ([GOOD], None),
        ([GOOD, {**GOOD, "transaction_id": "t2", "timestamp": "2025-03-01 10:15:30.25", "amount": 0,
                 "terminal_id": None, "channel": None, "age": None, "label": True}], None),
        ([{**GOOD, "label": 0}, {**GOOD, "transaction_id": "t2", "account_id": "B", "label": 1.0,
                                 "timestamp": "2024-02-29T23:59:59.123456789", "account_age_days": -3}], None),
        ([{k: v for k, v in GOOD.items() if k not in ("terminal_id", "age", "occupation")},
          {**GOOD, "transaction_id": "t3", "timestamp": "2025-03-01T10:16", "age": float("nan")}], None),
        ([{k: v for k, v in GOOD.items() if k != "terminal_id"}], None),  # no terminal column at all
        ([{"TX": "t1", "CUST": "C", "WHEN": "1999-12-31T00:00:00", "AMT": 3, "extra": [1, 2]}],
         {"transaction_id": "TX", "account_id": "CUST", "timestamp": "WHEN", "amount": "AMT"}),
    ]
    for records, columns in cases:
        assert _agree(records, columns) is not None, records
    weekdays = [validate_rows([{**GOOD, "timestamp": f"2025-03-{d:02d}T00:00:00"}]).dows[0] for d in range(1, 8)]
    assert weekdays == [5, 6, 0, 1, 2, 3, 4]  # 2025-03-01 was a Saturday


def test_timestamps_numpy_reads_are_pandas_readings() -> None:
    """The plain timestamps read by numpy (the cheap path of one-row requests) are pandas' ISO 8601
    readings to the nanosecond, over random times of 1700-2199 written each way the pattern admits;
    text numpy cannot read goes to pandas, which refuses it too."""
    rng = random.Random(3)
    texts = []
    for _ in range(20_000):
        t = dt.datetime(1700, 1, 1) + dt.timedelta(days=rng.randrange(500 * 365), seconds=rng.randrange(86_400))
        text = t.strftime(rng.choice(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M"]))
        if rng.random() < 0.3 and text.count(":") == 2:
            text += "." + str(rng.randrange(10**9)).zfill(9)[: rng.randint(1, 9)]
        texts.append(text)
    assert all(map(request_rows._NUMPY_TIME.fullmatch, texts))
    ours = request_rows._plain_times(texts)
    theirs = pd.to_datetime(pd.Index(texts, dtype=object), format="ISO8601").as_unit("ns").asi8
    assert ours is not None and ours.tolist() == theirs.tolist()
    for impossible in ("2025-02-29T00:00", "2025-03-01T24:00:00", "2025-03-01T10:60", "2025-13-01 00:00"):
        assert request_rows._NUMPY_TIME.fullmatch(impossible) and request_rows._plain_times([impossible]) is None


def test_requests_the_table_validation_refuses_are_refused_with_its_error() -> None:
    bad: list[tuple[list[dict[str, Any]], dict[str, str] | None]] = [
        ([{k: v for k, v in GOOD.items() if k != "amount"}], None),
        ([{**GOOD, "amount": -1.0}], None),
        ([{**GOOD, "amount": "12,5"}], None),
        ([{**GOOD, "amount": float("inf")}], None),
        ([{**GOOD, "amount": 1e308}], None),  # finite, but beyond the bound (sums would overflow)
        ([{**GOOD, "amount": 10**9 + 1}], None),
        ([{**GOOD, "age": 1e300}], None),
        ([{**GOOD, "account_age_days": -2e6}], None),
        ([{**GOOD, "timestamp": "not a time"}], None),
        ([{**GOOD, "timestamp": "2025-02-30T00:00:00"}], None),
        ([{**GOOD, "account_id": None}], None),
        ([{**GOOD, "label": "maybe"}], None),
        ([{**GOOD, "age": "old"}], None),
        ([GOOD, {**GOOD, "transaction_id": "t0", "timestamp": "2025-03-01T09:00:00"}], None),  # time order
        ([GOOD], {"account_id": "CUST"}),  # mapped column absent
        ([{**GOOD, "CUST": "X"}], {"account_id": "CUST"}),  # canonical and mapped source both present
        ([GOOD], {"nonsense": "x"}),
    ]
    for records, columns in bad:
        assert isinstance(_read(records, columns, table_only=True)[0], Exception), records
        assert _agree(records, columns) is None, records


def test_random_requests_agree_with_the_table_validation() -> None:
    rng = random.Random(7)
    pools: dict[str, list[Any]] = {
        "transaction_id": ["t1", "t2", 7, None, ""],
        "account_id": ["A", "B", 3, None, True],
        "timestamp": ["2025-03-01T10:00:00", "2025-03-01 11:30", "2025-03-02T00:00:00.5", "2025-03-01T10:00:00Z",
                      "2025-03-01T10:00:00+02:00", "2025-03-01", 1_700_000_000, "yesterday", None,
                      "2025-03-01T25:00:00", "2024-02-29 23:59:59.999999999", "2025-02-29T00:00", "2025-03-01T24:00",
                      "1650-01-01T00:00:00", "2025-03-01T10:00:00.1234567891", " 2025-03-01T10:00"],
        "amount": [0, 1, 12.5, -0.0, -2, "3", None, float("nan"), float("inf"), True, 1e18],
        "label": [0, 1, True, False, None, 0.0, 2, "1", "yes", float("nan")],
        "terminal_id": ["T1", "T2", None, 5, 5.0, float("nan")],
        "channel": ["pos", "web", None, 1],
        "category": ["grocery", None, 2.5],
        "age": [30, 41.5, None, float("nan"), "x", float("-inf"), False],
        "occupation": ["teacher", None, 0],
        "account_age_days": [10, -5.0, None, "12"],
        "scenario": ["s", None, 4],
    }
    took_fast = refused = 0
    for _ in range(200):
        records = []
        for _ in range(rng.randint(1, 4)):
            record = {}
            for name, pool in pools.items():
                if rng.random() < 0.85 or name in ("transaction_id", "account_id", "timestamp", "amount"):
                    # mostly well-formed values, so that both valid and invalid requests are common
                    record[name] = pool[0] if rng.random() < 0.9 else rng.choice(pool)
                if name == "amount" and rng.random() < 0.05:
                    record.pop(name)
            records.append(record)
        fast = _agree(records)
        took_fast += fast is not None
        refused += isinstance(_read(records, None, table_only=True)[0], Exception)
    assert took_fast > 20 and refused > 20  # both kinds were exercised


def test_a_transaction_id_twice_in_one_request_is_refused_and_changes_nothing(tmp_path) -> None:
    store = RocksStateStore(tmp_path / "s")
    state = OnlineFraudState.for_model(store)
    rows = validate_rows([GOOD, {**GOOD, "timestamp": "2025-03-01T11:00:00"}])  # valid as rows: the state
    # refuses the second application
    with pytest.raises(OrderError, match="appears twice"), state.update() as batch:
        batch.load(rows.accounts, [])
        batch.check(rows)
    assert store.read(ACCOUNT, ["A1"]) == {}


def test_terminal_windows_stay_right_with_rows_arriving_out_of_order(tmp_path) -> None:
    """Each account's rows come in time order but the accounts interleave, so a terminal's rows are
    often inserted before its latest one: its rows stay in time order through every insert/drop, and
    each row's terminal risk is that of the rows kept before it."""
    rng = random.Random(3)
    clocks = {f"a{i}": 0 for i in range(6)}
    state = OnlineFraudState.for_model(RocksStateStore(tmp_path / "s"))
    try:
        with state.update() as batch:
            for i in range(150):
                acct = rng.choice(list(clocks))
                clocks[acct] += rng.randint(0, 96) * 3600  # ~2 days apart: 150 rows span past the 38-day horizon
                stamp = "2025-01-01T00:00:00"
                t = dt.datetime.fromisoformat(stamp) + dt.timedelta(seconds=clocks[acct])
                label = rng.choice([None, 0, 1])
                rows = validate_rows([{**GOOD, "transaction_id": f"t{i}", "account_id": acct,
                                   "timestamp": t.isoformat(), "terminal_id": "x", "label": label}])
                batch.load([], ["x"])
                before = [list(r) for r in batch.pending.terminals["x"]["rows"]]
                [inputs] = batch.apply(rows, delay_days=7)
                stored = batch.pending.terminals["x"]["rows"]
                assert [r[0] for r in stored] == sorted(r[0] for r in stored)
                hi = sum(1 for r in before if r[0] < rows.t_ns[0] - 7 * 86_400 * 10**9)
                lo = sum(1 for r in before if r[0] < rows.t_ns[0] - 37 * 86_400 * 10**9)
                seen = [r[1] for r in before[lo:hi] if r[1] is not None]
                assert inputs.window["term_risk_30d"] == (sum(seen) / len(seen) if seen else 0.0)
        assert len(stored) < 150  # old rows were dropped on the way
    finally:
        state.store.close()
