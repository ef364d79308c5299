"""Online feature state of the fraud vertical: score one new transaction exactly as the
batch path would have scored it inside a file holding everything seen before it.

The batch path (:func:`solutions.fraud.scoring.score_transactions`) computes two kinds of
per-transaction inputs from a file, both from the past only: the sequence model's step features
and the window features (account windows over ``(t - w, t]``, terminal windows over
``[t - delay - w, t - delay)``: labels are known ``delay`` days late). Both are defined once, in
:mod:`solutions.fraud.feature_defs`, as vectorised updates over a chunk of rows and the earlier
rows of their keys: the batch path passes a whole file with no history, this module a run of a
request's rows in time order with the rows its state keeps. A row's step features never change
once computed, so the state keeps them as computed.

The minimal state for that, per account: the count and sum of its amounts, the terminals
it used, and its recent rows (those inside the longest window, at least the last
``history_len`` for sequences); per terminal: its rows (time, label, id) inside
``delay + max(window) + 1`` days. Rows are applied in arrival order, exactly like the
batch path's stable sort by time keeps a file's order for equal timestamps; a row older
than its account's latest row is refused (its step features would depend on rows that
came after it). A transaction is applied once: a scored row keeps its score and the version
that computed it, so a request sent again after its answer was lost (a replica killed between
its commit and its answer) is answered with what was stored, and applies nothing.

The state is kept behind one small protocol (:class:`infra.online_state.OnlineStateStore`):
RocksDB under the home (embedded, one process; a restart loses nothing) or Redis (several
processes or replicas share it). Both keep one stored row per transaction: an account's
recent rows and a small summary of it, a terminal's rows inside its windows (orjson: floats
round-trip exactly). An update is computed and written inside the store's exclusive section,
on the state kept in memory from the updates before (read from the store only for keys not
seen yet, or again when another writer committed meanwhile); it writes only what changed.
"""

from __future__ import annotations

import bisect
import logging
import math
import operator
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from infra.online_state import ACCOUNT, TERMINAL, AccountRow, Journal, OnlineStateStore, StateConflict
from infra.tables import ColumnSpec, TableSchema, validate_table
from solutions.fraud import feature_defs as FD
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.online_model import OnlineFraudModel, RowInputs, WindowRow
from solutions.fraud.request_rows import MAX_ID_CHARS, Rows, check_values, validate_rows

__all__ = [
    "ACCOUNT",
    "MAX_ID_CHARS",
    "TERMINAL",
    "DamagedState",
    "OnlineFraudModel",
    "OnlineFraudState",
    "OrderError",
    "RowInputs",
    "Rows",
    "ScoredRequest",
    "apply_labels",
    "challenger_fits",
    "check_values",
    "label_schema",
    "score_requests",
    "score_requests_with_inputs",
    "validate_rows",
]

log = logging.getLogger(__name__)

_NS_PER_DAY = 86_400 * 10**9
_NS_PER_S = 10**9
_NULL_TERMINAL = "\x00null"  # the batch path groups missing terminal ids together
_NEW_TERMINAL = FD.STEP_NUMERIC.index("new_terminal")


class OrderError(ValueError):
    """A transaction is older than the latest one already applied for its account."""


class DamagedState(OrderError):
    """The stored state of an account cannot be used (a running sum stored as null or infinite by a
    version that did not bound amounts): that account's transactions are refused (409) until an
    admin resets it; every other account scores as usual and the model's breaker counts nothing."""


# ------------------------------------------------------------------------------------
# features from the state


@dataclass
class _Pending:
    """The state in memory: documents by key, least recently used first."""

    accounts: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    terminals: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)


class OnlineFraudState:
    """Computes the batch path's inputs of new transactions from a store and updates it.

    The accounts and terminals an update touched stay in memory (at most ``cache_accounts``
    and ``cache_terminals`` of them, least recently used dropped first), with each terminal's
    running label counts, so the next update reads from the store only what it has not seen;
    the store tells at the start of each update whether another writer (process, replica)
    committed meanwhile, and then everything kept is forgotten and read again. An update
    writes only what changed (:class:`Journal`): new rows, the rows that left the windows and
    the accounts' small summaries.

    Args:
        store: where the state lives.
        windows_days: window lengths (the batch path's :class:`WindowFeatures` defaults).
        history_len: earlier rows kept per account for sequences (a model's ``seq_len - 1``
            must not exceed it).
        max_recent: at most this many rows per account (bounds an account's rows; an account
            with more rows inside the longest window gets approximate window features).
        cache_accounts: most accounts kept in memory between updates.
        cache_terminals: most terminals kept in memory between updates.
        max_terminal_rows: at most this many rows per terminal (its oldest dropped first): bounds a
            terminal's state, and so the time every scorer spends reading it, whatever one client
            writes to it (a terminal with more rows inside ``delay + max(window) + 1`` days gets
            approximate terminal windows, as ``max_recent`` does for accounts).
        late_tolerance_s: how much older than its account's latest row a row may be and still be
            applied (the server passes its clock skew). Decision (issue 46): late rows within this
            tolerance are ACCEPTED, not refused: such a row is applied to its account as if it came
            right after the latest row (its account features at the latest row's time, gap 0; its
            hour, weekday and terminal row keep its own time), because rows already scored cannot be
            recomputed. So a row dated up to the skew ahead of the clock (which one key may send)
            cannot lock an account: every real-time row is at most the skew older than it. Rows older
            than that still get :class:`OrderError` (409). 0: strict order, as the batch path.
    """

    def __init__(self, store: OnlineStateStore, windows_days: Sequence[int] = FD.WINDOWS_DAYS,
                 history_len: int = 255, max_recent: int = 4096, cache_accounts: int = 50_000,
                 cache_terminals: int = 10_000, max_terminal_rows: int = 20_000,
                 late_tolerance_s: float = 0.0) -> None:
        self.store = store
        self.max_terminal_rows = int(max_terminal_rows)
        self.late_ns = int(late_tolerance_s * _NS_PER_S)
        self.windows_days = tuple(int(w) for w in windows_days)
        self.history_len = int(history_len)
        self.max_recent = max(int(max_recent), self.history_len)
        self.cache_accounts = int(cache_accounts)
        self.cache_terminals = int(cache_terminals)
        self._cache = _Pending()

    @classmethod
    def for_model(cls, store: OnlineStateStore, **kwargs: Any) -> OnlineFraudState:
        """A state whose windows are those of the batch path's window transformer."""
        return cls(store, windows_days=P.window_transformer(7).windows_days, **kwargs)

    def _forget(self) -> None:
        self._cache = _Pending()

    @contextmanager
    def update(self) -> Iterator[_Batch]:
        """An exclusive update: compute rows with the yielded batch; committed on exit (on an
        exception nothing is written and what was kept in memory is dropped)."""
        try:
            with self.store.exclusive() as unchanged:
                if not unchanged:
                    self._forget()
                batch = _Batch(self)
                yield batch
                self.store.commit(batch.journal())
        except BaseException:
            self._forget()
            raise
        cache = self._cache
        while len(cache.accounts) > self.cache_accounts:
            cache.accounts.popitem(last=False)
        while len(cache.terminals) > self.cache_terminals:
            cache.terminals.popitem(last=False)

    def reset(self, kind: str, key: str) -> bool:
        """Forget one account's (or terminal's) online state, in the store and in memory: its next
        transaction scores as its first. False when there was none."""
        try:
            return self.store.reset(kind, key)
        finally:
            self._forget()


_row_time = operator.itemgetter(0)  # a stored row's time (bisect's key; C, unlike a def)
_row_value = operator.itemgetter(1)  # an account row's amount, a terminal row's label
_row_step = operator.itemgetter(4)  # an account row's step features
_row_cats = operator.itemgetter(2, 3)  # an account row's (channel, category)


def _same_tx(row: AccountRow, tx: str, t: int, late_ns: int) -> bool:
    """Whether stored account ``row`` is transaction ``tx`` dated ``t`` (a late row is stored at its
    account's latest time then, at most ``late_ns`` after its own)."""
    return len(row) > 5 and row[5] == tx and 0 <= row[0] - t <= late_ns


def _new_account() -> dict[str, Any]:
    return {"n": 0, "sum": 0.0, "terms": [], "seq": 0, "recent": []}


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _sound_account(doc: Mapping[str, Any]) -> bool:
    """Whether a stored account can be computed on: a whole count, a finite sum and finite (or NaN)
    amounts in its rows. A version that did not bound amounts could store a running sum of ``inf``
    (written as null); that entry alone is then refused (:class:`DamagedState`), never the route."""
    n = doc.get("n")
    if type(n) is not int or n < 0 or not _finite(doc.get("sum")) or not isinstance(doc.get("terms"), list):
        return False
    return all((type(r[1]) is float and not math.isinf(r[1])) or _finite(r[1]) for r in doc.get("recent", ()))


class _Batch:
    """The rows of one update, applied in order to the state in memory; what they change is
    recorded for the store."""

    def __init__(self, state: OnlineFraudState) -> None:
        self.state = state
        self.pending = state._cache
        self._touched: set[str] = set()
        self._journal = Journal()
        self._applied: list[tuple[str, int]] = []  # per applied row: its account, its place in the journal

    def journal(self) -> Journal:
        """The changes to persist (the touched accounts' summaries taken now)."""
        accounts = self.pending.accounts
        for a in self._touched:
            doc = accounts[a]
            self._journal.accounts[a] = {"n": doc["n"], "sum": doc["sum"], "terms": doc["terms"], "seq": doc["seq"]}
        return self._journal

    def load(self, accounts: Sequence[str], terminals: Sequence[str]) -> None:
        """Bring the documents the next rows need into memory (each read from the store once)."""
        cached_a, cached_t = self.pending.accounts, self.pending.terminals
        need_a = [a for a in dict.fromkeys(accounts) if a not in cached_a]
        need_t = [t for t in dict.fromkeys(terminals) if t not in cached_t]
        got_a = self.state.store.read(ACCOUNT, need_a) if need_a else {}
        # a terminal's read is sized by its bound, even for one stored before the bound existed
        got_t = self.state.store.read(TERMINAL, need_t, limit=self.state.max_terminal_rows) if need_t else {}
        for a in need_a:
            doc = got_a.get(a) or _new_account()
            if not _sound_account(doc):
                doc["damaged"] = True
            cached_a[a] = doc
        for t in need_t:
            doc = got_t.get(t) or {"rows": []}
            doc["next"] = max((r[3] for r in doc["rows"]), default=-1) + 1
            cached_t[t] = doc
        for a in accounts:
            cached_a.move_to_end(a)
        for t in terminals:
            cached_t.move_to_end(t)

    def check(self, rows: Rows | pd.DataFrame) -> None:
        """Raise :class:`OrderError` when a row is older than its account's latest row, or is a
        transaction already applied (applying it twice would count it twice; a whole request sent
        again is answered from :meth:`replayed` before this check), or its transaction id appears
        twice in ``rows``."""
        rows = rows if isinstance(rows, Rows) else Rows.from_frame(rows)
        damaged = [i for i, acct in enumerate(rows.accounts) if self.pending.accounts[acct].get("damaged")]
        if damaged:
            raise DamagedState(f"row {damaged[0]}: the stored online state of this account is damaged (written "
                               "before amounts were bounded); an admin can clear it with POST /v1/fraud/state/reset")
        seen: dict[str, int] = {}
        for i, tx in enumerate(rows.tx_ids):
            if tx is None:
                continue
            if tx in seen:
                raise OrderError(f"rows {seen[tx]} and {i}: transaction {tx!r} appears twice in one request; "
                                 "it is not applied twice")
            seen[tx] = i
        late_ns = self.state.late_ns
        for i, (acct, t, tx) in enumerate(zip(rows.accounts, rows.t_ns, rows.tx_ids, strict=True)):
            recent = self.pending.accounts[acct]["recent"]
            if tx is not None and any(_same_tx(r, tx, t, late_ns) for r in reversed(recent)):
                raise OrderError(f"row {i}: transaction {tx!r} was already scored; it is not applied twice")
            if recent and t < recent[-1][0] - late_ns:  # the message names no other transaction or time
                raise OrderError(
                    f"row {i}: this transaction is older than the latest one already scored for its account "
                    "by more than the tolerance; online scoring is order-based"
                )

    def replayed(self, rows: Rows) -> list[tuple[float, int]] | None:
        """When every row of ``rows`` is a transaction already applied and scored (same id, account,
        time and amount: a client sending a request again whose answer it lost, to this replica or
        another), the stored (score, version) of each row, in order; else None. Needs the rows'
        accounts loaded."""
        if not len(rows) or any(tx is None for tx in rows.tx_ids) or any(
                self.pending.accounts[a].get("damaged") for a in rows.accounts):
            return None
        out: list[tuple[float, int]] = []
        for acct, t, tx, amount in zip(rows.accounts, rows.t_ns, rows.tx_ids, rows.amounts, strict=True):
            stored = next((r for r in reversed(self.pending.accounts[acct]["recent"])
                           if _same_tx(r, tx, t, self.state.late_ns)), None)
            if stored is None or len(stored) < 8 or not (stored[1] == amount or (math.isnan(stored[1])
                                                          and math.isnan(amount))):
                return None
            out.append((stored[6], stored[7]))
        return out

    def record_scores(self, scores: Sequence[float], version: int) -> None:
        """Store each row applied in this update with its score and the version that computed it
        (in the order applied), so a request sent again is answered as it was the first time."""
        if len(scores) != len(self._applied):
            raise ValueError(f"{len(scores)} scores for {len(self._applied)} applied rows")
        rows = self._journal.account_rows
        for (acct, j), score in zip(self._applied, scores, strict=True):
            key, seq, row = rows[j]
            scored = (*row[:6], float(score), int(version))
            rows[j] = (key, seq, scored)
            recent = self.pending.accounts[acct]["recent"]
            for i in range(len(recent) - 1, -1, -1):  # the row itself, unless it already left the window
                if recent[i] is row:
                    recent[i] = scored
                    break
        self._applied = []

    def _features(self, r: Rows, start: int, end: int,
                  delay_days: int) -> tuple[list[tuple[float, ...]], list[WindowRow]]:
        """The sequence steps and window features of rows ``start:end`` (in time order) from the state
        before them: the one definition (:mod:`solutions.fraud.feature_defs`) over what the state
        keeps for their accounts and terminals."""
        windows, late = self.state.windows_days, np.iinfo(np.int64).min
        span_ns, delay_ns = max(windows) * _NS_PER_DAY, int(delay_days) * _NS_PER_DAY
        t_own, amounts = np.array(r.t_ns[start:end], np.int64), np.array(r.amounts[start:end], np.float64)
        accounts, terminals = r.accounts[start:end], r.terminals[start:end]
        earliest = dict(zip(reversed(accounts), reversed(r.t_ns[start:end]), strict=True))
        key, first = _codes(accounts), {a: earliest[a] for a in dict.fromkeys(accounts)}  # in code order
        docs = [self.pending.accounts[a] for a in first]
        summary = FD.AccountSummary(np.array([d["n"] for d in docs], np.int64),
                                    np.array([d["sum"] for d in docs], np.float64),
                                    np.array([d["recent"][-1][0] if d["recent"] else late for d in docs], np.int64))
        chunk = FD.KeyedRows(key, np.maximum(t_own, summary.latest[key]), (amounts,))  # a late row joins after
        # only rows inside the longest window of an account's first row can count
        history = _history([(d["recent"], max(first[a], latest) - span_ns, None)
                            for a, d, latest in zip(first, docs, summary.latest.tolist(), strict=True)], side="right")
        hours, dows = np.array(r.hours[start:end]), np.array(r.dows[start:end])
        feats = {**FD.row_features(amounts, hours, dows),
                 **FD.account_windows(windows, chunk, history, max_rows=self.state.max_recent)}
        term_codes = known_pair = None
        if r.has_terminal:
            term_codes = _codes(terminals)
            known_pair = np.fromiter((t is not None and t in d["terms"] for d, t in
                                      zip((self.pending.accounts[a] for a in accounts), terminals, strict=True)),
                                     bool, len(accounts))
            term_keys = [t if t is not None else _NULL_TERMINAL for t in terminals]
            lo, hi = int(t_own.min()) - delay_ns - span_ns, int(t_own.max()) - delay_ns
            feats.update(FD.terminal_windows(
                windows, delay_days, FD.KeyedRows(_codes(term_keys), t_own, (np.array(r.labels[start:end]),)),
                _history([(self.pending.terminals[t]["rows"], lo, hi) for t in dict.fromkeys(term_keys)])))
        steps = FD.step_features(chunk, hours + np.array(r.minutes[start:end]) / 60.0, dows,
                                 np.where(np.array([t is None for t in terminals]), -1, term_codes)
                                 if term_codes is not None else None, summary, known_pair)
        wins = WindowRow.rows(list(feats), np.column_stack(list(feats.values())))
        return list(map(tuple, steps.tolist())), wins

    def apply(self, rows: Rows | pd.DataFrame, delay_days: int, keep: int | None = None) -> list[RowInputs]:
        """Compute every row's inputs in order and add the rows to the state.

        The features of each run of rows in time order are computed together from the state
        before the run (:meth:`_features`); the rows are then added one by one.

        Args:
            rows: validated rows (a frame with canonical columns, or its :class:`Rows`), in arrival order.
            delay_days: the model's label delay of the terminal windows.
            keep: steps per row the caller needs (a model's ``seq_len``: the row and its ``keep - 1``
                predecessors); None: as many as the state keeps.
        """
        r = rows if isinstance(rows, Rows) else Rows.from_frame(rows)
        wmax = max(self.state.windows_days)
        delay_ns = int(delay_days) * _NS_PER_DAY
        has_terminal = r.has_terminal
        t_ns = r.t_ns
        accounts, terminals, amounts, labels, tx_ids = r.accounts, r.terminals, r.amounts, r.labels, r.tx_ids
        channels, categories = r.channels, r.categories
        ages, acc_ages, occupations = r.ages, r.acc_ages, r.occupations
        self.load(accounts, [t if t is not None else _NULL_TERMINAL for t in terminals] if has_terminal else [])
        journal, touched = self._journal, self._touched
        hist = self.state.history_len if keep is None else min(self.state.history_len, max(int(keep) - 1, 0))
        runs = np.flatnonzero(np.diff(np.array(t_ns, dtype=np.int64)) < 0) + 1  # where time goes back
        run_ends = [*runs.tolist(), len(r)]
        steps: list[tuple[float, ...]] = []
        wins: list[WindowRow] = []
        run_start = run_end = 0

        out: list[RowInputs] = []
        late_ns, history_len, max_recent = self.state.late_ns, self.state.history_len, self.state.max_recent
        account_rows, applied = journal.account_rows, self._applied
        for i, acct_id in enumerate(accounts):
            if i == run_end:
                run_start, run_end = i, run_ends.pop(0)
                steps, wins = self._features(r, run_start, run_end, delay_days)
            step, win = steps[i - run_start], wins[i - run_start]
            t_own, amount = t_ns[i], amounts[i]
            acct = self.pending.accounts[acct_id]
            recent: list[AccountRow] = acct["recent"]
            if recent and t_own < recent[-1][0] - late_ns:
                raise OrderError(f"row {i}: older than the latest transaction already scored for its account")
            # a late row (within the tolerance) joins its account right after the latest row
            t = max(t_own, recent[-1][0]) if recent else t_own
            term = terminals[i]
            before = recent[-hist:] if hist else ()
            out.append(RowInputs(
                steps=[*map(_row_step, before), step],
                step_cats=[*map(_row_cats, before), (channels[i], categories[i])],
                window=win,
                static=(ages[i], acc_ages[i]),
                occupation=occupations[i],
            ))
            # -- add the row to the state
            row = (t, amount, channels[i], categories[i], step, tx_ids[i])
            recent.append(row)
            account_rows.append((acct_id, acct["seq"], row))
            applied.append((acct_id, len(account_rows) - 1))
            acct["seq"] += 1
            touched.add(acct_id)
            keep_from = t - wmax * _NS_PER_DAY
            cut = 0
            while cut < len(recent) - history_len and recent[cut][0] <= keep_from:
                cut += 1
            cut = max(cut, len(recent) - max_recent)
            if cut:
                del recent[:cut]
                journal.account_cut[acct_id] = acct["seq"] - len(recent)
            if not math.isnan(amount):
                acct["n"] += 1
                acct["sum"] += max(amount, 0.0)
            if step[_NEW_TERMINAL]:
                acct["terms"].append(term)
            if has_terminal:
                self._add_terminal_row(term if term is not None else _NULL_TERMINAL, t_own, labels[i], tx_ids[i],
                                       delay_ns + (wmax + 1) * _NS_PER_DAY)
        return out

    def _add_terminal_row(self, term_key: str, t: int, label: float, tx: str | None, span_ns: int) -> None:
        """Insert a row into its terminal's rows (in time order); drop those no window can need any
        more (older than ``span_ns`` before the terminal's latest) and the oldest past the bound."""
        tdoc = self.pending.terminals[term_key]
        trows = tdoc["rows"]
        trow = (t, None if math.isnan(label) else float(label), tx, tdoc["next"])
        tdoc["next"] += 1
        trows.insert(bisect.bisect_right(trows, t, key=_row_time), trow)
        self._journal.terminal_rows.append((term_key, trow))
        horizon = trows[-1][0] - span_ns
        drop = max(bisect.bisect_left(trows, horizon, key=_row_time), len(trows) - self.state.max_terminal_rows)
        if drop > 0:
            self._journal.dropped += [(term_key, row) for row in trows[:drop]]
            del trows[:drop]


def _codes(keys: Sequence[Any]) -> np.ndarray:
    """Each key's code: its place among the distinct keys, in order of first appearance."""
    codes: dict[Any, int] = {}
    return np.fromiter((codes.setdefault(k, len(codes)) for k in keys), np.int64, len(keys))


def _history(spans: Sequence[tuple[Sequence[Any], int, int | None]], side: str = "left") -> FD.KeyedRows:
    """Per key (its code: its place in ``spans``), its kept rows ``(time, value, ...)`` (in time order)
    with times in ``[lo, hi)`` (``side="right"``: ``(lo, hi)``; hi None: no bound); a None value reads as NaN."""
    cut = bisect.bisect_left if side == "left" else bisect.bisect_right
    kept: list[Any] = []
    counts: list[int] = []
    for rows, lo, hi in spans:
        part = rows[cut(rows, lo, key=_row_time):None if hi is None else bisect.bisect_left(rows, hi, key=_row_time)]
        kept += part
        counts.append(len(part))
    return FD.KeyedRows(np.repeat(np.arange(len(spans), dtype=np.int64), counts),
                        np.fromiter(map(_row_time, kept), np.int64, len(kept)),
                        (np.array(list(map(_row_value, kept)), np.float64),))


def label_schema() -> TableSchema:
    """Label feedback rows: which transaction (id, terminal, time) turned out fraud or legit."""
    return TableSchema(
        name="fraud-labels",
        columns=(
            ColumnSpec(name=S.TRANSACTION_ID, kind="id"),
            ColumnSpec(name=S.TERMINAL_ID, kind="id"),
            ColumnSpec(name=S.TIMESTAMP, kind="datetime"),
            ColumnSpec(name=S.LABEL, kind="binary"),
        ),
    )


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
    table = validate_table(frame, label_schema(), source="request")
    t_ns = table[S.TIMESTAMP].to_numpy().astype("datetime64[ns]").astype(np.int64).tolist()
    terminals = [str(t) for t in table[S.TERMINAL_ID].tolist()]
    missing: list[str] = []
    with state.update() as batch:
        batch.load([], terminals)
        for tx, term, t, label in zip(table[S.TRANSACTION_ID].tolist(), terminals, t_ns,
                                      table[S.LABEL].tolist(), strict=True):
            rows = batch.pending.terminals[term]["rows"]
            times = [r[0] for r in rows]
            lo, hi = bisect.bisect_left(times, t), bisect.bisect_right(times, t)
            hits = [j for j in range(lo, hi) if rows[j][2] == str(tx)]
            if not hits:
                missing.append(str(tx))
            for j in hits:
                t_j, _, tx_j, rid = rows[j]
                rows[j] = (t_j, float(label), tx_j, rid)
                batch._journal.labels.append((term, rows[j]))
    return missing


@dataclass(frozen=True)
class ScoredRequest:
    """One request scored by :func:`score_requests_with_inputs`: the model's scores (row order), the
    rows' inputs (what a second version, a challenger, scores without touching the state again),
    the rows' account ids and transaction ids (canonical strings). ``versions`` is set for a request
    sent again (every row already applied): nothing was applied, ``scores`` are the stored ones,
    ``versions`` the versions that computed them, and there are no inputs."""

    scores: np.ndarray
    inputs: list[RowInputs]
    accounts: list[str]
    ids: list[str | None]
    has_terminal: bool
    versions: list[int] | None = None


#: Times an update overtaken by another writer (:class:`StateConflict`) is computed before it fails.
_CONFLICT_ATTEMPTS = 3


def score_requests(model: OnlineFraudModel, state: OnlineFraudState,
                   requests: Sequence[Sequence[Mapping[str, Any]]],
                   columns: Mapping[str, str] | None = None, *,
                   max_time_ns: int | None = None) -> list[np.ndarray | Exception]:
    """Per request, its scores (float64, row order) or the error that refused it: see
    :func:`score_requests_with_inputs`."""
    return [r if isinstance(r, Exception) else r.scores
            for r in score_requests_with_inputs(model, state, requests, columns, max_time_ns=max_time_ns)]


def challenger_fits(champion: OnlineFraudModel, challenger: OnlineFraudModel) -> str | None:
    """Why ``challenger`` cannot score the inputs computed for ``champion`` (None: it can). Inputs
    are computed once, with the champion's label delay: a challenger trained with another delay
    would need its own terminal windows."""
    if challenger.delay_days != champion.delay_days:
        return (f"{challenger.name}:{challenger.version} uses a label delay of {challenger.delay_days} days, the "
                f"champion {champion.delay_days}: its terminal windows differ, so it is not scored")
    return None


def score_requests_with_inputs(model: OnlineFraudModel, state: OnlineFraudState,
                               requests: Sequence[Sequence[Mapping[str, Any]]],
                               columns: Mapping[str, str] | None = None, *,
                               max_time_ns: int | None = None, keep: int | None = None,
                               max_amount: float = P.MAX_AMOUNT,
                               ) -> list[ScoredRequest | Exception]:
    """Score several requests' rows in order with one model call.

    Each request is validated on its own (what it is refused for, or scored as, never depends
    on the other requests of the batch): its rows by the one validator (:func:`validate_rows`:
    the batch path's rules, ids and categories included), its timestamps against
    ``max_time_ns``, and whether it gives the terminal windows the model needs. Each request
    is then applied atomically: one whose rows break the time order of an account gets an
    :class:`OrderError` and leaves the state as it was. A request whose every row was already
    applied and scored (a client's retry after a lost answer, on any replica) is answered with the
    stored scores (:attr:`ScoredRequest.versions` set) and applies nothing; each applied row is
    stored with its score and the model's version. If the model call fails, nothing is
    committed. An update overtaken by another writer of a shared store (:class:`StateConflict`:
    nothing of it was written) is computed again on the new state.

    Args:
        model: the version that scores.
        state: the online state.
        requests: per request, its rows (source column names).
        columns: the column mapping canonical -> source.
        max_time_ns: latest timestamp accepted (ns since the epoch of naive timestamps; the server clock plus
            the allowed skew). A transaction dated in the future would otherwise become its
            account's latest and make every later real transaction of it "older". None: no bound.
        keep: steps per row kept in the inputs (default the model's ``seq_len``; more for a
            challenger with a longer sequence).
        max_amount: the largest amount accepted (a request with a larger one gets a
            :class:`DataValidationError`).

    Returns:
        Per request: its :class:`ScoredRequest` or the error that refused it.
    """
    if model.seq_len - 1 > state.history_len:
        raise ValueError(f"the model's seq_len {model.seq_len} needs more history than the state keeps "
                         f"({state.history_len} rows per account)")
    frames: list[Rows | Exception] = []
    for rows in requests:
        try:
            frame = validate_rows(rows, columns, max_amount=max_amount)
        except (DataValidationError, ValueError) as exc:
            frames.append(exc)
            continue
        if max_time_ns is not None:
            ahead = [i for i, t in enumerate(frame.t_ns) if t > max_time_ns]
            if ahead:
                frames.append(DataValidationError(
                    f"timestamp(s) in the future: after {pd.Timestamp(max_time_ns)}, the server clock plus the "
                    "allowed skew",
                    source="request", column=S.TIMESTAMP, rows=ahead[:5]))
                continue
        if model.needs_terminal and not frame.has_terminal:
            frames.append(DataValidationError(
                "the model needs the terminal windows (term_nb_tx_*, term_risk_*), which rows without "
                f"a {S.TERMINAL_ID!r} column cannot give", source="request", column=S.TERMINAL_ID))
            continue
        frames.append(frame)
    steps = max(model.seq_len, int(keep or 0))
    if steps - 1 > state.history_len:
        raise ValueError(f"{steps} steps per row need more history than the state keeps "
                         f"({state.history_len} rows per account)")
    for attempt in range(_CONFLICT_ATTEMPTS):
        results: list[Rows | ScoredRequest | Exception] = []
        spans: list[tuple[int, int]] = []
        inputs: list[RowInputs] = []
        try:
            with state.update() as batch:
                for frame in frames:
                    if isinstance(frame, Exception):
                        results.append(frame)
                        spans.append((0, 0))
                        continue
                    batch.load(frame.accounts, [])
                    stored = batch.replayed(frame)
                    if stored is not None:  # sent again: answered as the first time, nothing applied
                        results.append(ScoredRequest(
                            scores=np.array([score for score, _ in stored], dtype=np.float64), inputs=[],
                            accounts=frame.accounts, ids=frame.tx_ids, has_terminal=frame.has_terminal,
                            versions=[version for _, version in stored]))
                        spans.append((0, 0))
                        continue
                    try:
                        batch.check(frame)
                    except OrderError as exc:
                        results.append(exc)
                        spans.append((0, 0))
                        continue
                    rows = batch.apply(frame, model.delay_days, keep=steps)
                    spans.append((len(inputs), len(inputs) + len(rows)))
                    inputs.extend(rows)
                    results.append(frame)
                scores = model.predict(inputs)
                batch.record_scores(scores.tolist(), model.version)
            break
        except StateConflict:  # nothing was written: computed again on the state as it is now
            if attempt == _CONFLICT_ATTEMPTS - 1:
                raise
            log.warning("online-state update overtaken by another writer; computed again")
    return [r if isinstance(r, (Exception, ScoredRequest)) else
            ScoredRequest(scores=scores[a:b], inputs=inputs[a:b], accounts=r.accounts, ids=r.tx_ids,
                          has_terminal=r.has_terminal)
            for r, (a, b) in zip(results, spans, strict=True)]
