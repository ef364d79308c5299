"""Online feature state of the fraud vertical: score one new transaction exactly as the
batch path would have scored it inside a file holding everything seen before it.

The batch path (:func:`solutions.fraud.scoring.score_transactions`) computes two kinds of
per-transaction inputs from a file, both from the past only:

* the sequence model's step features (:func:`solutions.fraud.sequences.step_features`):
  gap to the account's previous transaction, the mean of ALL its earlier amounts, whether
  the (account, terminal) pair is new, hour and weekday; a row's step features never
  change once computed, so the state keeps them as computed;
* the window features (:class:`solutions.fraud.features.WindowFeatures`): the account's
  count and mean amount over ``(t - w, t]`` and the terminal's count and fraud share over
  ``[t - delay - w, t - delay)`` (the DELAYED terminal risk: labels are known ``delay``
  days late), for ``w`` in the windows (1/7/30 days).

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
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.online_model import OnlineFraudModel, RowInputs
from solutions.fraud.request_rows import MAX_ID_CHARS, Rows, check_values, validate_rows
from solutions.fraud.sequences import MAX_GAP_S, STEP_NUMERIC

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

    def __init__(self, store: OnlineStateStore, windows_days: Sequence[int] = (1, 7, 30),
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
        # per cached terminal, kept in step with its rows: the row times, and running counts of
        # known labels and of positive labels (count[j] - count[i] = labels among rows i..j-1)
        self._term_index: dict[str, tuple[list[int], list[int], list[int]]] = {}

    @classmethod
    def for_model(cls, store: OnlineStateStore, **kwargs: Any) -> OnlineFraudState:
        """A state whose windows are those of the batch path's window transformer."""
        return cls(store, windows_days=P.window_transformer(7).windows_days, **kwargs)

    def _forget(self) -> None:
        self._cache = _Pending()
        self._term_index = {}

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
            self._term_index.pop(cache.terminals.popitem(last=False)[0], None)

    def reset(self, kind: str, key: str) -> bool:
        """Forget one account's (or terminal's) online state, in the store and in memory: its next
        transaction scores as its first. False when there was none."""
        try:
            return self.store.reset(kind, key)
        finally:
            self._forget()


def _row_time(row: Sequence[Any]) -> int:
    return row[0]


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
        self._term_index = state._term_index
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

    def _index(self, terminal: str) -> tuple[list[int], list[int], list[int]]:
        index = self._term_index.get(terminal)
        if index is None:
            rows = self.pending.terminals[terminal]["rows"]
            known, positive = [0], [0]
            for r in rows:
                known.append(known[-1] + (r[1] is not None))
                positive.append(positive[-1] + (r[1] is not None and r[1] > 0))
            index = self._term_index[terminal] = ([r[0] for r in rows], known, positive)
        return index

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

    def apply(self, rows: Rows | pd.DataFrame, delay_days: int, keep: int | None = None) -> list[RowInputs]:
        """Compute every row's inputs in order and add the rows to the state.

        Args:
            rows: validated rows (a frame with canonical columns, or its :class:`Rows`), in arrival order.
            delay_days: the model's label delay of the terminal windows.
            keep: steps per row the caller needs (a model's ``seq_len``: the row and its ``keep - 1``
                predecessors); None: as many as the state keeps.
        """
        r = rows if isinstance(rows, Rows) else Rows.from_frame(rows)
        windows = self.state.windows_days
        wmax = max(windows)
        cap_s = float(wmax) * 86_400.0
        delay_ns = int(delay_days) * _NS_PER_DAY
        has_terminal = r.has_terminal
        t_ns, hours, minutes, dows = r.t_ns, r.hours, r.minutes, r.dows
        accounts, terminals, amounts, labels, tx_ids = r.accounts, r.terminals, r.amounts, r.labels, r.tx_ids
        channels, categories = r.channels, r.categories
        ages, acc_ages, occupations = r.ages, r.acc_ages, r.occupations
        self.load(accounts, [t if t is not None else _NULL_TERMINAL for t in terminals] if has_terminal else [])
        journal, touched = self._journal, self._touched
        cust_keys = [(w, f"cust_nb_tx_{w}d", f"cust_mean_amount_{w}d") for w in windows]
        term_keys = [(w, f"term_nb_tx_{w}d", f"term_risk_{w}d") for w in windows]
        mean_max_key = f"cust_mean_amount_{wmax}d"
        hist = self.state.history_len if keep is None else min(self.state.history_len, max(int(keep) - 1, 0))

        out: list[RowInputs] = []
        late_ns = self.state.late_ns
        for i, acct_id in enumerate(accounts):
            t_own, amount = t_ns[i], amounts[i]
            acct = self.pending.accounts[acct_id]
            recent: list[AccountRow] = acct["recent"]
            if recent and t_own < recent[-1][0] - late_ns:
                raise OrderError(f"row {i}: older than the latest transaction already scored for its account")
            # a late row (within the tolerance) joins its account right after the latest row
            t = max(t_own, recent[-1][0]) if recent else t_own
            # -- step features (solutions.fraud.sequences.step_features)
            amount_c = max(amount, 0.0) if not math.isnan(amount) else amount
            gap = (t - recent[-1][0]) / _NS_PER_S if recent else None
            prior_mean = acct["sum"] / acct["n"] if acct["n"] > 0 else amount_c
            term = terminals[i]
            new_terminal = has_terminal and term is not None and term not in acct["terms"]
            hour = hours[i] + minutes[i] / 60.0
            # math's functions on floats: the same IEEE results as numpy's to the last bit or two
            # (the features are compared to the batch path's at 1e-9), ~10x cheaper per scalar
            log_amount = math.log1p(amount_c)
            step = (
                log_amount,
                math.log1p(min(max(MAX_GAP_S if gap is None else gap, 0.0), MAX_GAP_S)),
                math.sin(2 * math.pi * hour / 24),
                math.cos(2 * math.pi * hour / 24),
                math.sin(2 * math.pi * dows[i] / 7),
                math.cos(2 * math.pi * dows[i] / 7),
                float(new_terminal),
                log_amount - math.log1p(prior_mean),
                float(gap is None),
            )
            assert len(step) == len(STEP_NUMERIC)
            # -- window features (solutions.fraud.features.WindowFeatures)
            win: dict[str, float] = {
                "amount": amount,
                "log_amount": math.log1p(max(amount, 0.0)),
                "hour": float(hours[i]),
                "is_weekend": float(dows[i] >= 5),
                "is_night": float(hours[i] >= 22 or hours[i] < 6),
                "secs_since_prev": min(gap, cap_s) if gap is not None else cap_s,
            }
            amt0 = 0.0 if math.isnan(amount) else amount
            for w, nb_key, mean_key in cust_keys:
                # the account's rows are in time order: those inside (t - w, t] are a suffix
                start = bisect.bisect_right(recent, t - w * _NS_PER_DAY, key=_row_time)
                nb = len(recent) - start + 1
                win[nb_key] = float(nb)
                win[mean_key] = (math.fsum([r[1] for r in recent[start:]]) + amt0) / nb
            mean_max = win[mean_max_key]
            win[f"amount_over_cust_mean_{wmax}d"] = amount / mean_max if mean_max > 0 else 1.0
            term_key = (term if term is not None else _NULL_TERMINAL) if has_terminal else None
            if term_key is not None:
                times, n_known, n_pos = self._index(term_key)
                hi = bisect.bisect_left(times, t_own - delay_ns)
                for w, nb_key, risk_key in term_keys:
                    lo = bisect.bisect_left(times, t_own - delay_ns - w * _NS_PER_DAY)
                    known = n_known[hi] - n_known[lo]
                    win[nb_key] = float(hi - lo)
                    win[risk_key] = (n_pos[hi] - n_pos[lo]) / known if known else 0.0
            out.append(RowInputs(
                steps=[r[4] for r in recent[-hist:]] + [step] if hist else [step],
                step_cats=[(r[2], r[3]) for r in recent[-hist:]] + [(channels[i], categories[i])]
                if hist else [(channels[i], categories[i])],
                window=win,
                static=(ages[i], acc_ages[i]),
                occupation=occupations[i],
            ))
            # -- add the row to the state
            row = (t, amount, channels[i], categories[i], step, tx_ids[i])
            recent.append(row)
            journal.account_rows.append((acct_id, acct["seq"], row))
            self._applied.append((acct_id, len(journal.account_rows) - 1))
            acct["seq"] += 1
            touched.add(acct_id)
            keep_from = t - wmax * _NS_PER_DAY
            cut = 0
            while cut < len(recent) - self.state.history_len and recent[cut][0] <= keep_from:
                cut += 1
            cut = max(cut, len(recent) - self.state.max_recent)
            if cut:
                del recent[:cut]
                journal.account_cut[acct_id] = acct["seq"] - len(recent)
            if not math.isnan(amount_c):
                acct["n"] += 1
                acct["sum"] += amount_c
            if new_terminal:
                acct["terms"].append(term)
            if term_key is not None:
                tdoc = self.pending.terminals[term_key]
                trows = tdoc["rows"]
                times, n_known, n_pos = self._index(term_key)
                label = None if math.isnan(labels[i]) else float(labels[i])
                pos = bisect.bisect_right(times, t_own)
                trow = (t_own, label, tx_ids[i], tdoc["next"])
                tdoc["next"] += 1
                trows.insert(pos, trow)
                journal.terminal_rows.append((term_key, trow))
                times.insert(pos, t_own)
                k, p = int(label is not None), int(label is not None and label > 0)
                if pos == len(times) - 1:  # the usual case: the newest row of its terminal
                    n_known.append(n_known[-1] + k)
                    n_pos.append(n_pos[-1] + p)
                else:
                    n_known[pos + 1 :] = [n_known[pos] + k, *(c + k for c in n_known[pos + 1 :])]
                    n_pos[pos + 1 :] = [n_pos[pos] + p, *(c + p for c in n_pos[pos + 1 :])]
                horizon = times[-1] - delay_ns - (wmax + 1) * _NS_PER_DAY
                drop = max(bisect.bisect_left(times, horizon), len(times) - self.state.max_terminal_rows)
                if drop:
                    journal.dropped += [(term_key, r) for r in trows[:drop]]
                    del trows[:drop]
                    del times[:drop]
                    del n_known[:drop]
                    del n_pos[:drop]
        return out


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
            if hits:
                batch._term_index.pop(term, None)  # its running label counts are rebuilt when next needed
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
