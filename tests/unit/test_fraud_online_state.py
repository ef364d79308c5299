"""The fraud online state computes the batch path's step and window features row by row (ties in
time included), refuses out-of-order rows without changing the state, and stays bounded."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pandas as pd
import pytest

from infra.online_state.rocks import RocksStateStore
from infra.tables import validate_table
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.online import (
    ACCOUNT,
    TERMINAL,
    OnlineFraudState,
    OrderError,
    validate_rows,
)
from solutions.fraud.sequences import step_features


def _frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    minutes = np.sort(rng.integers(0, 60 * 24 * 50, n))
    minutes[10:20] = minutes[10]  # ties: several rows at one instant
    return pd.DataFrame({
        S.TRANSACTION_ID: [f"t{i}" for i in range(n)],
        S.ACCOUNT_ID: rng.choice(["a", "b", "c", "d"], n),
        S.TIMESTAMP: (pd.Timestamp("2025-01-01") + pd.to_timedelta(minutes, unit="min")).astype(str),
        S.AMOUNT: rng.gamma(2.0, 30.0, n).round(2),
        S.LABEL: rng.random(n) < 0.2,
        S.TERMINAL_ID: rng.choice(["x", "y", "z"], n),
        S.CHANNEL: rng.choice(["pos", "web"], n),
    })


def test_rows_get_the_batch_paths_features(tmp_path) -> None:
    raw = _frame()
    df = validate_table(raw, P.transaction_schema(for_scoring=True), "t")
    wf = P.window_transformer(7).fit(df)
    batch_win = wf.transform(df)
    keys = df[[S.ACCOUNT_ID, S.TIMESTAMP]].reset_index(drop=True)
    order = keys.sort_values([S.ACCOUNT_ID, S.TIMESTAMP], kind="stable").index.to_numpy()
    steps = step_features(df.iloc[order].reset_index(drop=True))
    batch_steps = np.empty_like(steps.to_numpy())
    batch_steps[order] = steps.to_numpy()

    state = OnlineFraudState.for_model(RocksStateStore(tmp_path / "s"), history_len=8)
    rows = []
    for start in range(0, len(raw), 37):  # requests of varying size, in arrival order
        with state.update() as batch:
            rows += batch.apply(validate_rows(raw.iloc[start : start + 37].to_dict("records")), delay_days=7)
    online_win = pd.DataFrame([r.window for r in rows])
    for name in online_win.columns:
        np.testing.assert_allclose(online_win[name], batch_win[name], rtol=1e-9, atol=1e-9, err_msg=name)
    np.testing.assert_allclose(np.array([r.steps[-1] for r in rows]), batch_steps, rtol=1e-9, atol=1e-9)


def test_an_out_of_order_row_is_refused_and_changes_nothing(tmp_path) -> None:
    store = RocksStateStore(tmp_path / "s")
    state = OnlineFraudState.for_model(store)
    row = {S.TRANSACTION_ID: "1", S.ACCOUNT_ID: "a", S.TIMESTAMP: "2025-01-02 10:00", S.AMOUNT: 5.0,
           S.TERMINAL_ID: "x"}
    with state.update() as batch:
        batch.apply(validate_rows([row]), delay_days=7)
    before = store.read(ACCOUNT, ["a"])
    with pytest.raises(OrderError, match="older"), state.update() as batch:
        batch.load(["a"], [])
        batch.check(validate_rows([{**row, S.TRANSACTION_ID: "2", S.TIMESTAMP: "2025-01-01 10:00"}]))
    assert store.read(ACCOUNT, ["a"]) == before
    with pytest.raises(Exception, match="time order"):
        validate_rows([row, {**row, S.TIMESTAMP: "2025-01-01 09:00"}])


def test_state_documents_stay_bounded(tmp_path) -> None:
    store = RocksStateStore(tmp_path / "s")
    state = OnlineFraudState.for_model(store, history_len=4, max_recent=50)
    stamps = pd.date_range("2025-01-01", periods=900, freq="2h")  # 75 days, 12 a day
    rows = [{S.TRANSACTION_ID: str(i), S.ACCOUNT_ID: "a", S.TIMESTAMP: str(t), S.AMOUNT: 1.0, S.TERMINAL_ID: "x"}
            for i, t in enumerate(stamps)]
    with state.update() as batch:
        batch.apply(validate_rows(rows), delay_days=7)
    account = store.read(ACCOUNT, ["a"])["a"]
    terminal = store.read(TERMINAL, ["x"])["x"]
    assert len(account["recent"]) == 50 and account["n"] == 900  # capped; the all-time mean still counts all
    span_days = (terminal["rows"][-1][0] - terminal["rows"][0][0]) / 86_400e9
    assert span_days <= 7 + 30 + 1  # only what the delayed terminal windows can still need


def test_the_rows_in_memory_leave_the_garbage_collectors_walk(tmp_path) -> None:
    """Rows kept as lists made every full GC walk all cached transactions (320-360 ms pauses in
    serving); as tuples of numbers and strings the collector stops tracking them, a labelled row too."""
    import gc

    from solutions.fraud.online import apply_labels

    raw = _frame(200)
    state = OnlineFraudState.for_model(RocksStateStore(tmp_path / "s"), history_len=8)
    with state.update() as batch:
        batch.apply(validate_rows(raw.to_dict("records")), delay_days=7)
    first = raw.iloc[-1]  # the newest: still inside its terminal's windows
    apply_labels(state, [{S.TRANSACTION_ID: first[S.TRANSACTION_ID], S.TERMINAL_ID: first[S.TERMINAL_ID],
                          S.TIMESTAMP: first[S.TIMESTAMP], S.LABEL: 1}])
    state._forget()
    with state.update() as batch:  # and the rows read back from the store
        batch.load(sorted(set(raw[S.ACCOUNT_ID])), sorted(set(raw[S.TERMINAL_ID])))
    gc.collect()
    gc.collect()  # a row whose step tuple came later in the collector's list is untracked on the next pass
    for memory in (state._cache.accounts, state._cache.terminals):
        docs = list(memory.values())
        rows = [r for d in docs for r in d.get("recent", d.get("rows", []))]
        assert rows and not any(gc.is_tracked(r) for r in rows)
    labelled = [r for r in state._cache.terminals[first[S.TERMINAL_ID]]["rows"] if r[2] == first[S.TRANSACTION_ID]]
    assert labelled[0][1] == 1.0


def test_a_request_out_of_time_order_scores_as_its_rows_one_by_one(tmp_path) -> None:
    """Accounts interleave, so a request's rows may go back in time (each account's stay in order): it
    is computed in runs of rows in time order, each from the state its earlier runs left, which gives
    what applying its rows one request at a time gives (a missing terminal included)."""
    rng = np.random.default_rng(5)
    raw = _frame(240, seed=5)  # in time order
    queues = {a: g.to_dict("records") for a, g in raw.groupby(S.ACCOUNT_ID, sort=True)}
    rows = []
    while queues:  # a random interleaving of the accounts, each one's rows in time order
        a = sorted(queues)[rng.integers(len(queues))]
        rows.append(queues[a].pop(0))
        if not queues[a]:
            del queues[a]
    for r in rows[::7]:
        r[S.TERMINAL_ID] = None
    assert any(pd.Timestamp(a[S.TIMESTAMP]) > pd.Timestamp(b[S.TIMESTAMP]) for a, b in pairwise(rows))  # it goes back in time
    together = OnlineFraudState.for_model(RocksStateStore(tmp_path / "a"), history_len=8)
    alone = OnlineFraudState.for_model(RocksStateStore(tmp_path / "b"), history_len=8)
    got, want = [], []
    for start in range(0, len(rows), 60):
        with together.update() as batch:
            got += batch.apply(validate_rows(rows[start : start + 60]), delay_days=1)
    for row in rows:
        with alone.update() as batch:
            want += batch.apply(validate_rows([row]), delay_days=1)
    for g, w in zip(got, want, strict=True):
        assert g.window.keys() == w.window.keys()
        np.testing.assert_allclose(list(g.window.values()), list(w.window.values()), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(g.steps, w.steps, rtol=1e-12, atol=1e-9)


def test_a_model_windows_come_from_its_recorded_features_and_pair_challengers() -> None:
    """Windows are read from the features a version records; inputs computed for a champion's windows
    are not given to a challenger trained with others."""
    from types import SimpleNamespace

    from solutions.fraud.feature_defs import WINDOWS_DAYS, windows_of
    from solutions.fraud.online import challenger_fits
    from solutions.fraud.online_model import OnlineFraudModel

    def gbm(*names: str, version: int = 1) -> OnlineFraudModel:
        return OnlineFraudModel(net=None, preprocessor=None, seq_len=1, threshold=0.5, delay_days=7, name="m",
                                version=version, baseline=SimpleNamespace(feature_names=list(names)))  # type: ignore[arg-type]

    champion = gbm("amount", "cust_nb_tx_1d", "cust_mean_amount_7d", "term_risk_30d", "channel=web")
    assert champion.windows_days == (1, 7, 30) and windows_of(["amount", "hour"]) == WINDOWS_DAYS
    assert challenger_fits(champion, gbm("cust_nb_tx_1d", "term_risk_7d", "cust_mean_amount_30d", version=2)) is None
    other = gbm("cust_nb_tx_2d", "term_nb_tx_14d", version=3)
    assert other.windows_days == (2, 14)
    assert "trained with windows (2, 14)" in (challenger_fits(champion, other) or "")


class _AmountModel:
    """What score_requests_with_inputs asks of a model; a row scores its 1-day amount mean / 1000."""

    seq_len, delay_days, needs_terminal, version, windows_days = 4, 7, False, 3, None

    def predict(self, rows: list) -> np.ndarray:
        return np.array([sum(r.window.values()) / 1000.0 for r in rows])


def test_the_requests_of_a_batch_score_as_they_would_one_call_each(tmp_path) -> None:
    """A batch's requests are applied together while their accounts and ids differ (one feature
    computation for many single-row requests instead of one each); each still gets what it gets
    applied alone, after the ones before it: the same inputs and scores, the same refusals (a replay,
    an id sent again with another amount, an id under another owner, a row too old), the same state."""
    from solutions.fraud.online import ScoredRequest, score_requests_with_inputs

    rng = np.random.default_rng(11)
    n = 300
    minutes = np.sort(rng.integers(0, 60 * 24 * 20, n))
    raw = pd.DataFrame({
        S.TRANSACTION_ID: [f"t{i}" for i in range(n)],
        S.ACCOUNT_ID: rng.choice([f"a{i}" for i in range(40)], n),
        S.TIMESTAMP: (pd.Timestamp("2025-01-01") + pd.to_timedelta(minutes, unit="min")).astype(str),
        S.AMOUNT: rng.gamma(2.0, 30.0, n).round(2),
        S.TERMINAL_ID: rng.choice(["x", "y", "z", "w"], n),
        S.CHANNEL: rng.choice(["pos", "web"], n),
    })
    records = raw.to_dict("records")
    requests = [[r] for r in records]
    requests[150:152] = [records[150:152]]  # a two-row request among them
    requests.insert(100, [records[12]])  # sent again (a later batch): answered with its stored score
    requests.insert(80, [{**records[60], S.AMOUNT: 1.0}])  # its id again, another amount: refused
    requests.insert(120, [{**records[100], S.TRANSACTION_ID: "old", S.TIMESTAMP: "2024-06-01 00:00:00"}])
    requests.insert(160, [{**records[130], S.TRANSACTION_ID: "t131"}])  # t131 comes later, under its own account
    requests.insert(200, [{k: v for k, v in records[190].items() if k != S.TERMINAL_ID} | {S.TRANSACTION_ID: "nt"}])
    owners = [[f"h-{r[S.ACCOUNT_ID]}" for r in req] for req in requests]
    model = _AmountModel()
    together = OnlineFraudState.for_model(RocksStateStore(tmp_path / "together"), history_len=8)
    alone = OnlineFraudState.for_model(RocksStateStore(tmp_path / "alone"), history_len=8)
    got = []
    for start in range(0, len(requests), 64):
        got += score_requests_with_inputs(model, together, requests[start : start + 64],
                                          owners=owners[start : start + 64])
    want = [score_requests_with_inputs(model, alone, [req], owners=[own])[0] for req, own in zip(requests, owners)]
    kinds = [type(w).__name__ for w in want]
    assert kinds.count("OrderError") == 3 and sum(isinstance(w, ScoredRequest) and w.versions is not None for w in want) == 1
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w)
        if not isinstance(w, ScoredRequest):
            assert str(g) == str(w)
            continue
        # a run's windows are sums over more rows at once: equal to rounding (as the runs of one request)
        np.testing.assert_allclose(g.scores, w.scores, rtol=1e-12)
        assert g.versions == w.versions
        for gi, wi in zip(g.inputs, w.inputs, strict=True):
            assert list(gi.window) == list(wi.window) and gi.step_cats == wi.step_cats
            np.testing.assert_allclose(list(gi.window.values()), list(wi.window.values()), rtol=1e-12, atol=1e-9)
            np.testing.assert_allclose(gi.steps, wi.steps, rtol=1e-12, atol=1e-9)
    accounts, terminals = sorted(raw[S.ACCOUNT_ID].unique()), ["x", "y", "z", "w", "\x00null"]
    with together.store.exclusive(), alone.store.exclusive():
        assert together.store.read(ACCOUNT, accounts) == alone.store.read(ACCOUNT, accounts)
        assert together.store.read(TERMINAL, terminals) == alone.store.read(TERMINAL, terminals)


def test_kept_columns_mirror_the_rows_through_inserts_drops_and_labels(tmp_path) -> None:
    """The numpy columns the windows and the model's steps read (KeptColumns) equal the kept rows:
    a terminal's after rows appended, a row inserted before its terminal's newest, rows dropped past
    the windows and the bound, and labels recorded later; an account's after rows appended and its
    oldest dropped past its bound."""
    from solutions.fraud.online import apply_labels
    from solutions.fraud.online_features import KeptColumns, row_time, row_value

    raw = _frame(600, seed=3).drop(columns=[S.LABEL])
    raw[S.ACCOUNT_ID] = [f"acct{i % 40}" for i in range(len(raw))]  # accounts in order; terminals interleave
    state = OnlineFraudState.for_model(RocksStateStore(tmp_path / "s"), history_len=8, max_recent=10,
                                       max_terminal_rows=50)
    for start in range(0, len(raw), 50):
        part = raw.iloc[start : start + 50].to_dict("records")
        if start == 300:  # a new account's row dated before its terminal's newest row: inserted there
            newest = [r for r in part if r[S.TERMINAL_ID] == "x"][-1]
            part.append(dict(newest, **{S.TRANSACTION_ID: "late", S.ACCOUNT_ID: "late-acct",
                                        S.TIMESTAMP: str(pd.Timestamp(newest[S.TIMESTAMP]) - pd.Timedelta(minutes=1))}))
        with state.update() as batch:
            batch.apply(validate_rows(part), delay_days=7)
        labelled = raw.iloc[start : start + 50 : 3]
        apply_labels(state, [{S.TRANSACTION_ID: r[S.TRANSACTION_ID], S.TERMINAL_ID: r[S.TERMINAL_ID],
                              S.TIMESTAMP: r[S.TIMESTAMP], S.LABEL: 1} for r in labelled.to_dict("records")])
        checked = 0
        for doc in state._cache.terminals.values():
            if doc.get("cols") is None:
                continue
            cols = KeptColumns.of(doc)
            np.testing.assert_array_equal(cols.t[cols.start:cols.end], [row_time(r) for r in doc["rows"]])
            np.testing.assert_array_equal(cols.value[cols.start:cols.end],
                                          [np.nan if row_value(r) is None else row_value(r) for r in doc["rows"]])
            checked += 1
        assert checked or start == 0
        for doc in state._cache.accounts.values():
            cols = KeptColumns.of(doc, "recent")
            assert len(cols) == len(doc["recent"])
            np.testing.assert_array_equal(cols.t[cols.start:cols.end], [row_time(r) for r in doc["recent"]])
            np.testing.assert_array_equal(cols.value[cols.start:cols.end], [row_value(r) for r in doc["recent"]])
            np.testing.assert_array_equal(cols.steps(len(cols)), [r[4] for r in doc["recent"]])
    assert any(doc.get("cols") is not None and len(doc["rows"]) == 50 for doc in state._cache.terminals.values())
    assert any(doc["seq"] > len(doc["recent"]) == 10 for doc in state._cache.accounts.values())  # some dropped
