"""The online state's rows as the one feature definition reads them.

:func:`run_features` computes a run of a request's rows (in time order) with
:mod:`solutions.fraud.feature_defs`, from what :class:`solutions.fraud.online_state.OnlineFraudState`
keeps in memory for their accounts and terminals: the same functions the batch path calls on a
whole file, here over a chunk of rows and the kept rows of their keys (the *history*).

Kept rows are tuples whose first two items are a time (ns) and a value (an account row's amount,
a terminal row's label); a key's rows are in time order.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from solutions.fraud import feature_defs as FD
from solutions.fraud.online_model import WindowRow
from solutions.fraud.request_rows import Rows

__all__ = ["NULL_TERMINAL", "KeptColumns", "codes", "kept_rows", "row_time", "run_features"]

NULL_TERMINAL = "\x00null"  # the batch path groups missing terminal ids together
row_time = operator.itemgetter(0)  # a kept row's time (bisect's key; C, unlike a def)
row_value = operator.itemgetter(1)  # an account row's amount, a terminal row's label
row_step = operator.itemgetter(4)  # an account row's step features


def codes(keys: Sequence[Any]) -> np.ndarray:
    """Each key's code: its place among the distinct keys, in order of first appearance."""
    seen: dict[Any, int] = {}
    return np.fromiter((seen.setdefault(k, len(seen)) for k in keys), np.int64, len(keys))


class KeptColumns:
    """A key's kept rows as numpy columns beside the rows (the rows stay what is stored and journaled;
    the columns mirror them for the windows and the model's inputs): times (int64 ns), values (float64,
    NaN for none: an account row's amount, a terminal row's label) and, for an account, its rows' step
    features (float64 ``[rows, len(STEP_NUMERIC)]``).

    Every request slices its keys' rows inside their windows; materialising those rows from tuples cost
    ~0.3 us each, and a terminal keeps up to ``max_terminal_rows`` of them: once the bench's state held
    a week of rows, 256-row requests spent 55% of the server's time there (py-spy, 2026-12-07), and
    gathering a request's 4,096 account steps from tuples for the model cost ~1.3 ms.

    The columns change with the rows: a row is inserted in place (at the end in O(1), the common case
    and an account's only one), rows drop from the front in O(1) and a value is set in place. A slice
    of the rows handed out stays valid: rows are only ever written past the end or, for a terminal,
    shifted up by an insert before its newest row (whose slices no caller keeps), and a full buffer
    moves to a new one. :meth:`of` builds the columns from the rows of a key read from the store.
    """

    __slots__ = ("end", "start", "step", "t", "value")

    def __init__(self, rows: Sequence[tuple[Any, ...]], steps: bool) -> None:
        n = len(rows)
        self.t = np.fromiter(map(row_time, rows), np.int64, n)
        self.value = np.array(list(map(row_value, rows)), np.float64).reshape(n)  # None reads as NaN
        self.step = np.array(list(map(row_step, rows)), np.float64).reshape(n, len(FD.STEP_NUMERIC)) if steps else None
        self.start, self.end = 0, n

    @classmethod
    def of(cls, doc: dict[str, Any], rows: str = "rows") -> KeptColumns:
        """The columns of a key's document, built from its ``rows`` when it has none (an account's rows
        are ``recent``, with their steps)."""
        cols = doc.get("cols")
        if cols is None:
            cols = doc["cols"] = cls(doc[rows], steps=rows == "recent")
        return cols  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return self.end - self.start

    def insert(self, j: int, t: int, value: float | None, step: Sequence[float] | None = None) -> None:
        """A row at place ``j`` (``j`` = the row count: after the newest, the common case)."""
        if self.end == len(self.t):
            self._move()
        at = self.start + j
        if at < self.end:  # an older row than the newest: the later ones move up one (numpy copies overlaps)
            for col in (self.t, self.value, self.step):
                if col is not None:
                    col[at + 1:self.end + 1] = col[at:self.end]
        self.t[at], self.value[at] = t, value
        if self.step is not None:
            self.step[at] = step
        self.end += 1

    def _move(self) -> None:
        """The kept rows to the front of new buffers twice their count (the old ones stay as they are:
        slices handed out keep reading them)."""
        n = self.end - self.start

        def moved(col: np.ndarray) -> np.ndarray:
            out = np.empty((max(16, 2 * n), *col.shape[1:]), col.dtype)
            out[:n] = col[self.start:self.end]
            return out

        self.t, self.value = moved(self.t), moved(self.value)
        if self.step is not None:
            self.step = moved(self.step)
        self.start, self.end = 0, n

    def drop(self, k: int) -> None:
        """Forget the first ``k`` rows."""
        self.start += k

    def set_value(self, j: int, value: float | None) -> None:
        """Row ``j``'s value."""
        self.value[self.start + j] = value

    def steps(self, k: int) -> np.ndarray:
        """The step features of the newest ``k`` rows (fewer when it keeps fewer): a view."""
        assert self.step is not None, "a terminal keeps no steps"
        return self.step[max(self.start, self.end - k):self.end]


def kept_rows(docs: Sequence[dict[str, Any]], lo: Sequence[int], hi: int | None = None, *,
              rows: str = "rows", side: str = "left") -> FD.KeyedRows:
    """Per key (its code: its place in ``docs``), its kept rows' times and values with times in
    ``[lo, hi)`` (``side="right"``: ``(lo, hi)``; ``hi`` None: no bound), read from its
    :class:`KeptColumns` (``rows``: where its document keeps its rows, found by bisection)."""
    cut = bisect.bisect_left if side == "left" else bisect.bisect_right
    ts: list[np.ndarray] = []
    values: list[np.ndarray] = []
    counts: list[int] = []
    for doc, low in zip(docs, lo, strict=True):
        kept = doc[rows]
        a = cut(kept, low, key=row_time)
        b = len(kept) if hi is None else bisect.bisect_left(kept, hi, key=row_time)
        counts.append(max(b - a, 0))
        if b > a:
            cols = KeptColumns.of(doc, rows)
            ts.append(cols.t[cols.start + a:cols.start + b])
            values.append(cols.value[cols.start + a:cols.start + b])
    empty = not ts
    return FD.KeyedRows(np.repeat(np.arange(len(docs), dtype=np.int64), counts),
                        np.zeros(0, np.int64) if empty else np.concatenate(ts),
                        (np.zeros(0) if empty else np.concatenate(values),))


def run_features(account_docs: Mapping[str, dict[str, Any]], terminal_docs: Mapping[str, dict[str, Any]],
                 windows: Sequence[int], max_recent: int, r: Rows, start: int, end: int,
                 delay_days: int) -> tuple[list[tuple[float, ...]], list[WindowRow]]:
    """The sequence steps and window features of rows ``start:end`` of ``r`` (in time order) from the
    state before them.

    Args:
        account_docs: the kept accounts (``n``, ``sum``, ``terms``, ``recent`` rows), every account of
            the rows included.
        terminal_docs: the kept terminals (``rows``), every terminal of the rows included (a missing
            id under :data:`NULL_TERMINAL`).
        windows: the window lengths (days).
        max_recent: the bound on an account's kept rows (its windows count no more).
        r: the validated rows.
        start: first row of the run.
        end: the row after the run.
        delay_days: the label delay of the terminal windows.
    """
    late = np.iinfo(np.int64).min
    span_ns, delay_ns = max(windows) * FD.NS_PER_DAY, int(delay_days) * FD.NS_PER_DAY
    t_own, amounts = np.array(r.t_ns[start:end], np.int64), np.array(r.amounts[start:end], np.float64)
    accounts, terminals = r.accounts[start:end], r.terminals[start:end]
    earliest = dict(zip(reversed(accounts), reversed(r.t_ns[start:end]), strict=True))
    key, first = codes(accounts), {a: earliest[a] for a in dict.fromkeys(accounts)}  # in code order
    docs = [account_docs[a] for a in first]
    summary = FD.AccountSummary(np.array([d["n"] for d in docs], np.int64),
                                np.array([d["sum"] for d in docs], np.float64),
                                np.array([d["recent"][-1][0] if d["recent"] else late for d in docs], np.int64))
    chunk = FD.KeyedRows(key, np.maximum(t_own, summary.latest[key]), (amounts,))  # a late row joins after
    # only rows inside the longest window of an account's first row can count
    past = kept_rows(docs, [max(first[a], latest) - span_ns for a, latest in zip(first, summary.latest.tolist(),
                                                                                  strict=True)],
                     rows="recent", side="right")
    hours, dows = np.array(r.hours[start:end]), np.array(r.dows[start:end])
    feats = {**FD.row_features(amounts, hours, dows),
             **FD.account_windows(windows, chunk, past, max_rows=max_recent)}
    term_codes = known_pair = None
    if r.has_terminal:
        term_codes = codes(terminals)
        known_pair = np.fromiter((t is not None and t in d["terms"] for d, t in
                                  zip((account_docs[a] for a in accounts), terminals, strict=True)),
                                 bool, len(accounts))
        term_keys = [t if t is not None else NULL_TERMINAL for t in terminals]
        lo, hi = int(t_own.min()) - delay_ns - span_ns, int(t_own.max()) - delay_ns
        feats.update(FD.terminal_windows(
            windows, delay_days, FD.KeyedRows(codes(term_keys), t_own, (np.array(r.labels[start:end]),)),
            kept_rows(kept := [terminal_docs[t] for t in dict.fromkeys(term_keys)], [lo] * len(kept), hi)))
    steps = FD.step_features(chunk, hours + np.array(r.minutes[start:end]) / 60.0, dows,
                             np.where(np.array([t is None for t in terminals]), -1, term_codes)
                             if term_codes is not None else None, summary, known_pair)
    wins = WindowRow.rows(list(feats), np.column_stack(list(feats.values())))
    return list(map(tuple, steps.tolist())), wins
