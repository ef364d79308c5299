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

__all__ = ["NULL_TERMINAL", "TerminalColumns", "codes", "history", "row_time", "run_features", "terminal_history"]

NULL_TERMINAL = "\x00null"  # the batch path groups missing terminal ids together
row_time = operator.itemgetter(0)  # a kept row's time (bisect's key; C, unlike a def)
row_value = operator.itemgetter(1)  # an account row's amount, a terminal row's label


def codes(keys: Sequence[Any]) -> np.ndarray:
    """Each key's code: its place among the distinct keys, in order of first appearance."""
    seen: dict[Any, int] = {}
    return np.fromiter((seen.setdefault(k, len(seen)) for k in keys), np.int64, len(keys))


def history(spans: Sequence[tuple[Sequence[Any], int, int | None]], side: str = "left") -> FD.KeyedRows:
    """Per key (its code: its place in ``spans``), its kept rows ``(time, value, ...)`` (in time order)
    with times in ``[lo, hi)`` (``side="right"``: ``(lo, hi)``; hi None: no bound); a None value reads as NaN."""
    cut = bisect.bisect_left if side == "left" else bisect.bisect_right
    kept: list[Any] = []
    counts: list[int] = []
    for rows, lo, hi in spans:
        part = rows[cut(rows, lo, key=row_time):None if hi is None else bisect.bisect_left(rows, hi, key=row_time)]
        kept += part
        counts.append(len(part))
    return FD.KeyedRows(np.repeat(np.arange(len(spans), dtype=np.int64), counts),
                        np.fromiter(map(row_time, kept), np.int64, len(kept)),
                        (np.array(list(map(row_value, kept)), np.float64),))


class TerminalColumns:
    """A terminal's kept rows' times (int64 ns) and labels (float64, NaN unknown) as numpy columns,
    beside its rows (the rows stay what is stored and journaled; these mirror them for
    :func:`terminal_history`).

    Every request slices its terminals' rows inside their delayed windows; materialising those rows
    from tuples cost ~0.3 us each, and a terminal keeps up to ``max_terminal_rows`` of them: once the
    bench's state held a week of rows, 256-row requests spent 55% of the server's time there and
    served 2.6k rows/s (py-spy, 2026-12-07). The columns change with the rows: a row is inserted
    in place (at the end in O(1), the common case), rows drop from the front in O(1) and a label is
    set in place; :meth:`of` builds them from the rows of a terminal read from the store.
    """

    __slots__ = ("end", "label", "start", "t")

    def __init__(self, rows: Sequence[tuple[Any, ...]]) -> None:
        n = len(rows)
        size = max(64, 2 * n)
        self.t, self.label = np.empty(size, np.int64), np.empty(size, np.float64)
        self.t[:n] = np.fromiter(map(row_time, rows), np.int64, n)
        self.label[:n] = np.array([np.nan if v is None else v for v in map(row_value, rows)], np.float64)
        self.start, self.end = 0, n

    @classmethod
    def of(cls, doc: dict[str, Any]) -> TerminalColumns:
        """The columns of a terminal's document (built from its rows when it has none)."""
        cols = doc.get("cols")
        if cols is None:
            cols = doc["cols"] = cls(doc["rows"])
        return cols  # type: ignore[no-any-return]

    def insert(self, j: int, t: int, label: float | None) -> None:
        """A row at place ``j`` (``j`` = the row count: after the newest, the common case)."""
        if self.end == len(self.t):  # full: the kept rows move to the front of a buffer twice their size
            n = self.end - self.start
            size = max(64, 2 * n)
            t_new, label_new = np.empty(size, np.int64), np.empty(size, np.float64)
            t_new[:n], label_new[:n] = self.t[self.start:self.end], self.label[self.start:self.end]
            self.t, self.label, self.start, self.end = t_new, label_new, 0, n
        at = self.start + j
        if at < self.end:  # an older row than the newest: the later ones move up one (numpy copies overlaps)
            self.t[at + 1:self.end + 1] = self.t[at:self.end]
            self.label[at + 1:self.end + 1] = self.label[at:self.end]
        self.t[at] = t
        self.label[at] = np.nan if label is None else label
        self.end += 1

    def drop(self, k: int) -> None:
        """Forget the first ``k`` rows."""
        self.start += k

    def set_label(self, j: int, label: float | None) -> None:
        """Row ``j``'s label."""
        self.label[self.start + j] = np.nan if label is None else label


def terminal_history(docs: Sequence[dict[str, Any]], lo: int, hi: int) -> FD.KeyedRows:
    """Per terminal (its code: its place in ``docs``), its kept rows with times in ``[lo, hi)``, read
    from its :class:`TerminalColumns` (what :func:`history` gives from the rows)."""
    ts: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    counts: list[int] = []
    for doc in docs:
        rows = doc["rows"]
        a, b = bisect.bisect_left(rows, lo, key=row_time), bisect.bisect_left(rows, hi, key=row_time)
        counts.append(b - a)
        if b > a:
            cols = TerminalColumns.of(doc)
            ts.append(cols.t[cols.start + a:cols.start + b])
            labels.append(cols.label[cols.start + a:cols.start + b])
    empty = not ts
    return FD.KeyedRows(np.repeat(np.arange(len(docs), dtype=np.int64), counts),
                        np.zeros(0, np.int64) if empty else np.concatenate(ts),
                        (np.zeros(0) if empty else np.concatenate(labels),))


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
    past = history([(d["recent"], max(first[a], latest) - span_ns, None)
                    for a, d, latest in zip(first, docs, summary.latest.tolist(), strict=True)], side="right")
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
            terminal_history([terminal_docs[t] for t in dict.fromkeys(term_keys)], lo, hi)))
    steps = FD.step_features(chunk, hours + np.array(r.minutes[start:end]) / 60.0, dows,
                             np.where(np.array([t is None for t in terminals]), -1, term_codes)
                             if term_codes is not None else None, summary, known_pair)
    wins = WindowRow.rows(list(feats), np.column_stack(list(feats.values())))
    return list(map(tuple, steps.tolist())), wins
