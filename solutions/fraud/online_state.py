"""Online feature state of the fraud vertical: what it keeps of the transactions seen, so that a new
one gets the inputs the batch path would have computed inside a file holding everything before it.

The batch path (:func:`solutions.fraud.scoring.score_transactions`) computes two kinds of
per-transaction inputs from a file, both from the past only: the sequence model's step features
and the window features (account windows over ``(t - w, t]``, terminal windows over
``[t - delay - w, t - delay)``: labels are known ``delay`` days late). Both are defined once, in
:mod:`solutions.fraud.feature_defs`, as vectorised updates over a chunk of rows and the earlier
rows of their keys: the batch path passes a whole file with no history, this module a run of a
request's rows in time order with the rows its state keeps (:mod:`solutions.fraud.online_features`). A row's step features never change
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
import math
import operator
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from infra.online_state import ACCOUNT, TERMINAL, AccountRow, Journal, OnlineStateStore
from solutions.fraud import feature_defs as FD
from solutions.fraud.online_features import NULL_TERMINAL, KeptColumns, row_time, run_features
from solutions.fraud.online_model import RowInputs, WindowRow
from solutions.fraud.request_rows import Rows

__all__ = ["DamagedState", "OnlineFraudState", "OrderError"]

_NS_PER_DAY = FD.NS_PER_DAY
_NS_PER_S = FD.NS_PER_S
_NEW_TERMINAL = FD.STEP_NUMERIC.index("new_terminal")


class OrderError(ValueError):
    """A transaction is older than the latest one already applied for its account."""


class DamagedState(OrderError):
    """The stored state of an account cannot be used (a running sum stored as null or infinite by a
    version that did not bound amounts): that account's transactions are refused (409) until an
    admin resets it; every other account scores as usual and the model's breaker counts nothing."""


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
        windows_days: window lengths whose longest bounds the rows kept (None:
            :data:`~solutions.fraud.feature_defs.WINDOWS_DAYS`); a model's own windows are passed to
            each update (``apply``), read from the model as the batch path reads them.
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

    def __init__(self, store: OnlineStateStore, windows_days: Sequence[int] | None = None,
                 history_len: int = 255, max_recent: int = 4096, cache_accounts: int = 50_000,
                 cache_terminals: int = 10_000, max_terminal_rows: int = 20_000,
                 late_tolerance_s: float = 0.0) -> None:
        self.store = store
        self.max_terminal_rows = int(max_terminal_rows)
        self.late_ns = int(late_tolerance_s * _NS_PER_S)
        self.windows_days = tuple(int(w) for w in (windows_days if windows_days is not None else FD.WINDOWS_DAYS))
        self.history_len = int(history_len)
        self.max_recent = max(int(max_recent), self.history_len)
        self.cache_accounts = int(cache_accounts)
        self.cache_terminals = int(cache_terminals)
        self._cache = _Pending()

    @classmethod
    def for_model(cls, store: OnlineStateStore, **kwargs: Any) -> OnlineFraudState:
        """A state that keeps rows for the default windows (``WINDOWS_DAYS``); each update computes
        the windows of the model that scores (``apply(windows_days=model.windows_days)``), since one
        state serves the champion, its challengers and the versions a reload brings."""
        return cls(store, windows_days=None, **kwargs)

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

    def kept_ns(self, delay_days: int) -> int:
        """How long a terminal keeps a transaction's row after the terminal's newest (ns): as long as a
        delayed terminal window can need it, and so as long as its label can count."""
        return int(delay_days) * _NS_PER_DAY + (max(self.windows_days) + 1) * _NS_PER_DAY

    def owned(self, ids: Sequence[str], owners: Sequence[str]) -> list[bool]:
        """Per position, whether transaction ``ids[i]`` was scored under ``owners[i]`` (its claim kept:
        :meth:`_Batch.claim`)."""
        held = self.store.owners(ids)
        return [held.get(tx) == who for tx, who in zip(ids, owners, strict=True)]


_row_cats = operator.itemgetter(2, 3)  # an account row's (channel, category)


def _stored_row(recent: Sequence[AccountRow], tx: str, t: int, late_ns: int) -> AccountRow | None:
    """The newest of an account's kept rows (in time order) that is transaction ``tx`` dated ``t`` (a
    late row is stored at its account's latest time then, at most ``late_ns`` after its own); None.
    Read from the newest row back to the first older than ``t``: no older row can be it."""
    for row in reversed(recent):
        stored_t = row[0]
        if stored_t < t:
            return None
        if stored_t - t <= late_ns and len(row) > 5 and row[5] == tx:
            return row
    return None


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
        self._owners: dict[str, str] = {}  # transaction id -> owner, as stored or claimed in this update

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
            if tx is not None and _stored_row(recent, tx, t, late_ns) is not None:
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
            stored = _stored_row(self.pending.accounts[acct]["recent"], tx, t, self.state.late_ns)
            if stored is None or len(stored) < 8 or not (stored[1] == amount or (math.isnan(stored[1])
                                                          and math.isnan(amount))):
                return None
            out.append((stored[6], stored[7]))
        return out

    def owner_conflict(self, rows: Rows, owners: Sequence[str | None]) -> int | None:
        """The first row whose transaction id is held by another owner than the row's (claimed by an
        earlier commit, or earlier in this update); None when there is none. Rows without an id or
        an owner claim nothing."""
        pairs = [(i, tx, who) for i, (tx, who) in enumerate(zip(rows.tx_ids, owners, strict=True))
                 if tx is not None and who]
        known = self._owners
        unseen = [tx for _, tx, _ in pairs if tx not in known]
        if unseen:
            known.update(self.state.store.owners(unseen))
        return next((i for i, tx, who in pairs if known.get(tx, who) != who), None)

    def claim(self, rows: Rows, owners: Sequence[str | None], delay_days: int) -> None:
        """Claim the transaction ids of ``rows`` (applied, after :meth:`owner_conflict` found none) for
        their owners, in this update's commit: a claim is stored if and only if its transaction is.
        A claim is kept as long as the terminal windows keep its transaction (:meth:`OnlineFraudState.kept_ns`,
        counted from the newest claim's time), as long as a label for it can count."""
        known, claims = self._owners, self._journal.owners
        for tx, who, t in zip(rows.tx_ids, owners, rows.t_ns, strict=True):
            if tx is not None and who and tx not in known:
                known[tx] = who
                claims.append((tx, who, t))
        self._journal.owners_kept_ns = self.state.kept_ns(delay_days)

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

    def apply(self, rows: Rows | pd.DataFrame, delay_days: int, keep: int | None = None,
              windows_days: Sequence[int] | None = None) -> list[RowInputs]:
        """Compute every row's inputs in order and add the rows to the state.

        The features of each run of rows in time order are computed together from the state
        before the run (:func:`~solutions.fraud.online_features.run_features`); the rows are then added one by one.

        Args:
            rows: validated rows (a frame with canonical columns, or its :class:`Rows`), in arrival order.
            delay_days: the model's label delay of the terminal windows.
            keep: steps per row the caller needs (a model's ``seq_len``: the row and its ``keep - 1``
                predecessors); None: as many as the state keeps.
            windows_days: the model's window lengths (:attr:`OnlineModel.windows_days
                <solutions.fraud.online_model.OnlineFraudModel.windows_days>`, as the batch path reads
                them from the model); None: the state's. The state keeps rows for its own longest window.

        Raises:
            ValueError: a window of the model is longer than the state keeps rows for.
        """
        r = rows if isinstance(rows, Rows) else Rows.from_frame(rows)
        wmax = max(self.state.windows_days)
        windows = tuple(windows_days) if windows_days else self.state.windows_days
        if max(windows) > wmax:
            raise ValueError(f"the model's {max(windows)}-day window is longer than the online state keeps rows "
                             f"for ({wmax} days): open the state with windows_days={windows}")
        span_ns = self.state.kept_ns(delay_days)
        has_terminal = r.has_terminal
        t_ns = r.t_ns
        accounts, terminals, amounts, labels, tx_ids = r.accounts, r.terminals, r.amounts, r.labels, r.tx_ids
        channels, categories = r.channels, r.categories
        ages, acc_ages, occupations = r.ages, r.acc_ages, r.occupations
        self.load(accounts, [t if t is not None else NULL_TERMINAL for t in terminals] if has_terminal else [])
        journal, touched = self._journal, self._touched
        hist = self.state.history_len if keep is None else min(self.state.history_len, max(int(keep) - 1, 0))
        runs = np.flatnonzero(np.diff(np.array(t_ns, dtype=np.int64)) < 0) + 1  # where time goes back
        run_ends = [*runs.tolist(), len(r)]
        steps: list[tuple[float, ...]] = []
        wins: list[WindowRow] = []
        run_start = run_end = 0

        out: list[RowInputs] = []
        late_ns, history_len, max_recent = self.state.late_ns, self.state.history_len, self.state.max_recent
        account_rows, applied, docs = journal.account_rows, self._applied, self.pending.accounts
        window_ns = wmax * _NS_PER_DAY
        for i, acct_id in enumerate(accounts):
            if i == run_end:
                run_start, run_end = i, run_ends.pop(0)
                steps, wins = run_features(docs, self.pending.terminals, windows,
                                           self.state.max_recent, r, run_start, run_end, delay_days)
            step = steps[i - run_start]
            t_own, amount, tx, channel, category = t_ns[i], amounts[i], tx_ids[i], channels[i], categories[i]
            acct = docs[acct_id]
            recent: list[AccountRow] = acct["recent"]
            t = t_own
            if recent:
                latest = recent[-1][0]
                if t_own < latest - late_ns:
                    raise OrderError(f"row {i}: older than the latest transaction already scored for its account")
                if latest > t_own:  # a late row (within the tolerance) joins its account right after the latest row
                    t = latest
            before = recent[-hist:] if hist else ()
            cols = KeptColumns.of(acct, "recent")
            cols.insert(len(recent), t, amount, step)  # -- the row joins the state
            out.append(RowInputs(cols.steps(hist + 1), [*map(_row_cats, before), (channel, category)],
                                 wins[i - run_start], (ages[i], acc_ages[i]), occupations[i]))
            row = (t, amount, channel, category, step, tx)
            recent.append(row)
            seq = acct["seq"]
            account_rows.append((acct_id, seq, row))
            applied.append((acct_id, len(account_rows) - 1))
            acct["seq"] = seq + 1
            touched.add(acct_id)
            if len(recent) > history_len:  # rows past the history and outside the longest window leave
                keep_from = t - window_ns
                cut = 0
                while cut < len(recent) - history_len and recent[cut][0] <= keep_from:
                    cut += 1
                cut = max(cut, len(recent) - max_recent)
                if cut:
                    del recent[:cut]
                    cols.drop(cut)
                    journal.account_cut[acct_id] = acct["seq"] - len(recent)
            if amount == amount:  # not NaN
                acct["n"] += 1
                acct["sum"] += max(amount, 0.0)
            if step[_NEW_TERMINAL]:
                acct["terms"].append(terminals[i])
            if has_terminal:
                term = terminals[i]
                self._add_terminal_row(term if term is not None else NULL_TERMINAL, t_own, labels[i], tx, span_ns)
        return out

    def record_label(self, terminal: str, tx: str, t: int, label: float) -> bool:
        """Set the label of transaction ``tx`` of ``terminal`` dated ``t`` (its terminal loaded); False
        when the terminal keeps no such row (never scored, or older than its windows keep)."""
        rows = self.pending.terminals[terminal]["rows"]
        lo, hi = bisect.bisect_left(rows, t, key=row_time), bisect.bisect_right(rows, t, key=row_time)
        hits = [j for j in range(lo, hi) if rows[j][2] == tx]
        cols = self.pending.terminals[terminal].get("cols")
        for j in hits:
            t_j, _, tx_j, rid = rows[j]
            rows[j] = (t_j, float(label), tx_j, rid)
            if cols is not None:
                cols.set_value(j, float(label))
            self._journal.labels.append((terminal, rows[j]))
        return bool(hits)

    def _add_terminal_row(self, term_key: str, t: int, label: float, tx: str | None, span_ns: int) -> None:
        """Insert a row into its terminal's rows (in time order); drop those no window can need any
        more (older than ``span_ns`` before the terminal's latest) and the oldest past the bound."""
        tdoc = self.pending.terminals[term_key]
        trows = tdoc["rows"]
        trow = (t, None if math.isnan(label) else float(label), tx, tdoc["next"])
        tdoc["next"] += 1
        at = len(trows)  # the common case: the terminal's newest row
        if trows and trows[-1][0] > t:
            at = bisect.bisect_right(trows, t, key=row_time)
        trows.insert(at, trow)
        if (cols := tdoc.get("cols")) is not None:
            cols.insert(at, t, trow[1])
        self._journal.terminal_rows.append((term_key, trow))
        horizon = trows[-1][0] - span_ns
        if trows[0][0] >= horizon and len(trows) <= self.state.max_terminal_rows:
            return  # nothing leaves
        drop = max(bisect.bisect_left(trows, horizon, key=row_time), len(trows) - self.state.max_terminal_rows)
        if drop > 0:
            self._journal.dropped += [(term_key, row) for row in trows[:drop]]
            del trows[:drop]
            if (cols := tdoc.get("cols")) is not None:
                cols.drop(drop)
