"""The online state's stores (one stored row per transaction, the state kept in memory between
updates): two writers on one store (two store objects on one RocksDB folder, two replicas on one
Redis) compute exactly what one writer computes, labels and resets included; a failed update
leaves memory and store as they were; an update writes what changed only; a
request sent again (to either writer) is answered from the stored scores and applied once; the
Redis lock expires soon after a holder that stops renewing it, and an update that lost it writes
nothing and is computed again."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import redis

from infra.online_state import ACCOUNT, TERMINAL, StateConflict
from infra.online_state.redis_store import RedisStateStore
from infra.online_state.rocks import RocksStateStore
from solutions.fraud import schema as S
from solutions.fraud.online import (
    OnlineFraudState,
    OrderError,
    apply_labels,
    score_requests,
    score_requests_with_inputs,
    validate_rows,
)


def _frame(n: int = 360, seed: int = 4) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    minutes = np.sort(rng.integers(0, 60 * 24 * 60, n))  # 60 days: rows leave the 38-day terminal horizon
    return pd.DataFrame({
        S.TRANSACTION_ID: [f"t{i}" for i in range(n)],
        S.ACCOUNT_ID: rng.choice(["a", "b", "c", "d", "e"], n),
        S.TIMESTAMP: (pd.Timestamp("2025-01-01") + pd.to_timedelta(minutes, unit="min")).astype(str),
        S.AMOUNT: rng.gamma(2.0, 30.0, n).round(2),
        S.TERMINAL_ID: rng.choice(["x", "y", "z"], n),
        S.CHANNEL: rng.choice(["pos", "web"], n),
    })


def _inputs(rows: list[Any]) -> np.ndarray:
    names = sorted(rows[0].window)
    return np.array([[r.window[k] for k in names] + list(r.steps[-1]) for r in rows])


def _replay(writers: list[OnlineFraudState], raw: pd.DataFrame, chunk: int = 23) -> np.ndarray:
    """Apply ``raw`` in chunks, the writers taking turns; after every third chunk, its rows' labels
    arrive (through the next writer) and count for the later delayed terminal windows."""
    out: list[Any] = []
    for k, start in enumerate(range(0, len(raw), chunk)):
        part = raw.iloc[start : start + chunk]
        with writers[k % len(writers)].update() as batch:
            out += batch.apply(validate_rows(part.to_dict("records")), delay_days=7)
        if k % 3 == 2:
            labels = [{S.TRANSACTION_ID: r[S.TRANSACTION_ID], S.TERMINAL_ID: r[S.TERMINAL_ID],
                       S.TIMESTAMP: r[S.TIMESTAMP], S.LABEL: int(i % 4 == 0)}
                      for i, r in enumerate(part.to_dict("records"))]
            assert apply_labels(writers[(k + 1) % len(writers)], labels) == []
    return _inputs(out)


@pytest.fixture(params=["rocksdb", "redis"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A function opening a new connection to one shared store, per store kind."""
    if request.param == "rocksdb":
        return lambda: RocksStateStore(tmp_path / "shared")
    url = request.getfixturevalue("redis_url")
    return lambda: RedisStateStore(url)


def test_two_writers_on_one_store_compute_what_one_writer_computes(open_store: Any, tmp_path: Path) -> None:
    raw = _frame()
    alone = _replay([OnlineFraudState.for_model(RocksStateStore(tmp_path / "alone"), history_len=8)], raw)
    one, two = (OnlineFraudState.for_model(open_store(), history_len=8) for _ in range(2))
    shared = _replay([one, two], raw)
    np.testing.assert_array_equal(shared, alone)
    # what each writer kept in memory is the stored state: a third connection reads the same
    third = open_store()
    with third.exclusive():
        stored = third.read(ACCOUNT, ["a", "b"]), third.read(TERMINAL, ["x", "y", "z"])
    with one.update() as batch:
        batch.load(["a", "b"], ["x", "y", "z"])
        kept = ({k: batch.pending.accounts[k] for k in ("a", "b")},
                {k: {"rows": batch.pending.terminals[k]["rows"]} for k in ("x", "y", "z")})
    assert kept == stored
    assert max(len(d["rows"]) for d in stored[1].values()) < len(raw) / 3  # rows left the terminal windows


def test_a_reset_account_scores_as_new_in_every_writer(open_store: Any) -> None:
    raw = _frame(120)
    one, two = (OnlineFraudState.for_model(open_store(), history_len=8) for _ in range(2))
    _replay([one, two], raw)
    assert one.reset(ACCOUNT, "a") is True
    assert two.reset(ACCOUNT, "no-such-account") is False
    row = {S.TRANSACTION_ID: "new", S.ACCOUNT_ID: "a", S.TIMESTAMP: "2025-01-01 00:00", S.AMOUNT: 10.0,
           S.TERMINAL_ID: "x"}  # older than a's rows before the reset: accepted now
    for writer in (two, one):
        with pytest.raises(RuntimeError, match="discarded"), writer.update() as batch:
            [inputs] = batch.apply(validate_rows([row]), delay_days=7)
            assert inputs.window["cust_nb_tx_30d"] == 1.0 and inputs.steps[-1][-1] == 1.0  # a first transaction
            raise RuntimeError("discarded")  # nothing of this update is kept, in memory or stored


def test_a_failed_update_changes_neither_memory_nor_store(tmp_path: Path) -> None:
    raw = _frame(200)
    state = OnlineFraudState.for_model(RocksStateStore(tmp_path / "s"), history_len=8)
    reference = OnlineFraudState.for_model(RocksStateStore(tmp_path / "r"), history_len=8)
    first, second = raw.iloc[:100], raw.iloc[100:]
    _replay([state], first)
    _replay([reference], first)
    with pytest.raises(RuntimeError, match="model failed"), state.update() as batch:
        batch.apply(validate_rows(second.to_dict("records")), delay_days=7)
        raise RuntimeError("the model failed")
    np.testing.assert_array_equal(_replay([state], second), _replay([reference], second))


def test_an_update_writes_what_changed_only(tmp_path: Path) -> None:
    raw = _frame()
    state = OnlineFraudState.for_model(RocksStateStore(tmp_path / "s"), history_len=8)
    _replay([state], raw.iloc[:300])
    store, commit, written = state.store, state.store.commit, []

    def counted(journal: Any) -> None:  # the write batch's puts and deletes, and the generation's put
        commit(journal)
        written.append(store._batch.len() + 1)

    store.commit = counted  # type: ignore[method-assign]
    with state.update() as batch:
        batch.apply(validate_rows(raw.iloc[300:301].to_dict("records")), delay_days=7)
    [changed] = written
    # one account row, one terminal row, the account's summary, the generation, and the rows
    # that left the windows (a handful at most): not every row of the account and terminal
    assert 4 <= changed <= 12, changed


@dataclass
class _StubModel:
    """What :func:`score_requests_with_inputs` asks of a model; a row scores its amount / 1000."""

    seq_len: int = 4
    delay_days: int = 7
    needs_terminal: bool = True
    version: int = 3
    scale: float = 1000.0
    windows_days: tuple[int, ...] | None = None  # the state's windows

    def predict(self, rows: list[Any]) -> np.ndarray:
        return np.array([r.window["amount"] / self.scale for r in rows])


def test_a_request_sent_again_is_answered_as_the_first_time_and_applied_once(open_store: Any,
                                                                              tmp_path: Path) -> None:
    raw = _frame(60)
    requests = [raw.iloc[i : i + 5].to_dict("records") for i in range(0, len(raw), 5)]
    one, two = (OnlineFraudState.for_model(open_store(), history_len=8) for _ in range(2))
    alone = OnlineFraudState.for_model(RocksStateStore(tmp_path / "alone"), history_len=8)
    v3, v4 = _StubModel(), _StubModel(version=4, scale=10.0)  # v4: the champion after a promotion
    for k, request in enumerate(requests):
        writer, other = (one, two) if k % 2 else (two, one)
        [first] = score_requests_with_inputs(v3, writer, [request])
        # the answer was lost: sent again, to the other writer, after the champion moved; and beside
        # a new request in the same call
        [again] = score_requests_with_inputs(v4, other, [request])
        assert again.versions == [3] * len(request) and again.inputs == []
        np.testing.assert_array_equal(again.scores, first.scores)
        [expected] = score_requests(v3, alone, [request])
        np.testing.assert_array_equal(first.scores, expected)
    new = {**requests[-1][-1], S.TRANSACTION_ID: "new", S.TIMESTAMP: "2025-03-30 00:00"}
    again, fresh = score_requests_with_inputs(v3, one, [requests[-1], [new]])
    assert again.versions == [3] * 5 and fresh.versions is None and len(fresh.inputs) == 1
    score_requests(v3, alone, [[new]])
    accounts, terminals = sorted(raw[S.ACCOUNT_ID].unique()), sorted(raw[S.TERMINAL_ID].unique())
    with one.store.exclusive(), alone.store.exclusive():  # every transaction once, each with its score
        assert one.store.read(ACCOUNT, accounts) == alone.store.read(ACCOUNT, accounts)
        assert one.store.read(TERMINAL, terminals) == alone.store.read(TERMINAL, terminals)
    # a transaction id sent again with another amount, or beside a new one, is still refused
    for rows in ([{**requests[0][0], S.AMOUNT: 1.0}], [requests[-1][-1], {**new, S.TRANSACTION_ID: "new2"}]):
        [refused] = score_requests_with_inputs(v3, two, [rows])
        assert isinstance(refused, OrderError) and "already scored" in str(refused)


def test_a_transaction_id_is_claimed_in_its_rows_commit_and_kept_as_long_as_its_label_can_count(
        open_store: Any) -> None:
    """Each scored row's id is claimed for its owner in the same commit as the row (two writers see
    one claim; a refused request, or one whose model call failed, claims nothing), an id held by
    another owner refuses its request, and a claim is forgotten once the terminal windows no longer
    keep its transaction (delay + longest window + 1 day after it: 38 days here)."""
    raw = _frame(300)
    one, two = (OnlineFraudState.for_model(open_store(), history_len=8) for _ in range(2))
    model = _StubModel()
    records = raw.to_dict("records")
    owner = {r[S.TRANSACTION_ID]: f"h-{r[S.ACCOUNT_ID]}" for r in records}

    def score(state: OnlineFraudState, rows: list[dict[str, Any]], who: list[str] | None = None) -> Any:
        [result] = score_requests_with_inputs(model, state, [rows],
                                              owners=[who or [owner[r[S.TRANSACTION_ID]] for r in rows]])
        return result

    first = score(one, records[:10])
    assert not isinstance(first, Exception)
    assert two.owned(["t3", "t3", "t10"], ["h-" + records[3][S.ACCOUNT_ID], "h-other", owner["t10"]]) == [
        True, False, False]
    # the same id under another owner is refused, on either writer, and claims nothing of its request
    stolen = score(two, [{**records[10], S.TRANSACTION_ID: "t3"}, records[11]], who=["h-thief", owner["t11"]])
    assert isinstance(stolen, OrderError) and "row 0" in str(stolen) and "scored under another account" in str(stolen)
    assert one.owned(["t11"], [owner["t11"]]) == [False]

    class Failed(RuntimeError):
        pass

    class Failing(_StubModel):
        def predict(self, rows: list[Any]) -> np.ndarray:
            raise Failed("the model failed")

    with pytest.raises(Failed):
        score_requests_with_inputs(Failing(), one, [records[10:12]], owners=[[owner["t10"], owner["t11"]]])
    assert two.owned(["t10", "t11"], [owner["t10"], owner["t11"]]) == [False, False]
    for start in range(10, len(records), 20):
        assert not isinstance(score([one, two][start % 2], records[start : start + 20]), Exception)
    times = pd.to_datetime(raw[S.TIMESTAMP])
    kept = times >= times.iloc[-1] - pd.Timedelta(days=7 + 30 + 1)
    assert (~kept).sum() > 50 and kept.sum() > 50  # the stream spans more than the horizon
    ids = raw[S.TRANSACTION_ID].tolist()
    assert one.owned(ids, [owner[t] for t in ids]) == kept.tolist()


def test_the_lock_lives_while_its_holder_renews_it_and_expires_soon_after(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    holder, other = RedisStateStore(redis_url, lock_ttl_s=0.3), RedisStateStore(redis_url, lock_ttl_s=0.3)
    try:
        with holder.exclusive():
            assert 0 < client.pttl(holder.lock_key) <= 300  # a replica killed now blocks the others 0.3 s
            time.sleep(1.0)  # over three TTLs: the holder renewed it meanwhile
            assert 0 < client.pttl(holder.lock_key) <= 300
        assert not client.exists(holder.lock_key)
        # a holder that stops renewing (its process died inside an update) lets the others in after the TTL
        section = holder.exclusive()
        section.__enter__()
        holder.close()  # its keeper thread stops; the section is never left
        t0 = time.monotonic()
        with other.exclusive():
            waited = time.monotonic() - t0
        assert waited < 10.0, waited  # the TTL (0.3 s) let it in; a holder's lock never expiring would hang
    finally:
        other.close()
        client.close()


def test_a_writer_waiting_for_the_lock_takes_it_as_soon_as_it_is_released(redis_url: str) -> None:
    holder, waiter = RedisStateStore(redis_url), RedisStateStore(redis_url)
    taken: list[float] = []

    def wait() -> None:
        with waiter.exclusive():
            taken.append(time.monotonic())

    late = []
    try:
        for _ in range(3):
            with holder.exclusive():
                thread = threading.Thread(target=wait)
                thread.start()
                time.sleep(0.11)  # the other replica's update
                released = time.monotonic()
            thread.join(timeout=10)
            late.append(taken[-1] - released)
        assert max(late) < 0.05, late  # redis-py's default polling (every 0.1 s from the first try): ~90 ms
    finally:
        holder.close()
        waiter.close()


def test_an_update_that_lost_its_lock_writes_nothing(redis_url: str) -> None:
    raw = _frame(40)
    client = redis.Redis.from_url(redis_url)
    one, two = (OnlineFraudState.for_model(RedisStateStore(redis_url), history_len=8) for _ in range(2))
    with pytest.raises(StateConflict), one.update() as batch:
        batch.apply(validate_rows(raw.iloc[:30].to_dict("records")), delay_days=7)
        client.delete(one.store.lock_key)  # its lock expired meanwhile (the process paused past the TTL) ...
        with two.update() as other:  # ... and another replica took it and committed
            other.apply(validate_rows(raw.iloc[30:31].to_dict("records")), delay_days=7)
    third = RedisStateStore(redis_url)
    with third.exclusive():
        accounts = third.read(ACCOUNT, list("abcde"))
    assert sum(doc["n"] for doc in accounts.values()) == 1  # the row of the update that committed, only
    client.close()


def test_scoring_overtaken_by_another_writer_is_computed_again(redis_url: str, tmp_path: Path) -> None:
    raw = _frame(40)
    first = raw.to_dict("records")
    second = [{**first[-1], S.TRANSACTION_ID: "other", S.ACCOUNT_ID: "f"}]  # another account, same terminal
    one, two = (OnlineFraudState.for_model(RedisStateStore(redis_url), history_len=8) for _ in range(2))
    commit = one.store.commit
    overtaken: list[bool] = []

    def commit_after_another_writer(journal: Any) -> None:
        if not overtaken:  # the first time: the lock expires and the other replica commits first
            overtaken.append(True)
            one.store._redis.delete(one.store.lock_key)
            [scored] = score_requests(_StubModel(), two, [second])
            assert not isinstance(scored, Exception)
        commit(journal)

    one.store.commit = commit_after_another_writer  # type: ignore[method-assign]
    [scores] = score_requests(_StubModel(), one, [first])
    assert overtaken and not isinstance(scores, Exception)
    # as one writer applying `second` then `first` (the order the store saw them in) scores them
    alone = OnlineFraudState.for_model(RocksStateStore(tmp_path / "alone"), history_len=8)
    score_requests(_StubModel(), alone, [second])
    [expected] = score_requests(_StubModel(), alone, [first])
    np.testing.assert_array_equal(scores, expected)
    with one.update() as batch:
        batch.load(list("abcdef"), [])
        assert sum(d["n"] for d in batch.pending.accounts.values()) == 41
