"""The one definition of the fraud window features, used by the batch path and online scoring alike.

Each feature is a vectorised update: given the earlier rows of the keys involved (the *history*,
any order) and a chunk of new rows, it returns the new rows' features, each from the history and the
chunk's earlier rows only. The batch path (:class:`solutions.fraud.features.WindowFeatures`) passes
a whole file, sorted by time, as one chunk with no history; online scoring
(:class:`solutions.fraud.online.OnlineFraudState`) passes a request's rows with the rows its state
keeps for their accounts and terminals. Online equals batch because both run this code.

A chunk's rows must be in time order (ties: arrival order), so "earlier in the chunk" and "earlier in
time" agree: online scoring cuts a request into such runs and applies them one after another.

Features, for ``w`` in the window lengths (days, :data:`WINDOWS_DAYS` unless a caller passes others):

* :func:`step_features`: the sequence model's steps (``STEP_NUMERIC``): ``log_amount``,
  ``log_gap_s`` (to the account's previous row, capped at ``MAX_GAP_S``), hour and weekday on the unit
  circle, ``new_terminal`` (the account's first row at that terminal), ``log_amount_vs_mean``
  (against the mean of all its earlier known amounts; its own amount when none) and ``is_first``;
* :func:`row_features`: ``amount``, ``log_amount``, ``hour``, ``is_weekend``, ``is_night`` (22:00-06:00);
* :func:`account_windows`: ``secs_since_prev`` (since the account's previous row, capped at
  ``max(w)`` days; the cap when there is none), ``cust_nb_tx_{w}d`` / ``cust_mean_amount_{w}d`` over
  ``(t - w, t]``, the row itself included (missing amounts count as 0), and
  ``amount_over_cust_mean_{max(w)}d``;
* :func:`static_features`: the customer's ``age`` as given and ``log1p`` of the account's age in days;
* :func:`terminal_windows`: ``term_nb_tx_{w}d`` / ``term_risk_{w}d`` over ``[t - delay - w, t - delay)``
  (fraud labels are known ``delay`` late): the count, and the fraud share among rows with a known
  label (0 when none is known).

Sums are differences of cumulative sums over rows sorted by (key, time), bounds are
``np.searchsorted`` over a composite (key, time rank) key: no Python loop over rows or groups.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "WINDOWS_DAYS", "AccountSummary", "KeyedRows", "account_windows", "row_features", "static_features",
    "step_features", "terminal_windows", "windows_of",
]

NS_PER_DAY = 86_400 * 10**9
NS_PER_S = 10**9
NIGHT_HOURS = (22, 6)  # [22:00, 06:00)
#: The window lengths (days) of the account and terminal windows, batch and online: a window added here
#: is a feature of every path (its columns are named from the length; online state keeps ``max`` of them).
#: Read when a transformer is fitted or a state made (a test may set it; a 14-day window is the example of
#: ``tests/serve/test_fraud_skew.py``).
WINDOWS_DAYS: tuple[int, ...] = (1, 7, 30)


#: A window feature's name and its length: ``cust_nb_tx_14d`` -> 14 (the names below are made from the length).
_WINDOW_FEATURE = re.compile(r"^(?:cust_nb_tx|cust_mean_amount|term_nb_tx|term_risk)_([0-9]+)d$")


def windows_of(feature_names: Iterable[str]) -> tuple[int, ...]:
    """The window lengths (days) a model was trained with, read from the window features it records
    (its preprocessor's and its GBM's column names), so that batch and online scoring compute the
    model's windows whatever :data:`WINDOWS_DAYS` is now; :data:`WINDOWS_DAYS` when it names none."""
    found = {int(m.group(1)) for m in map(_WINDOW_FEATURE.match, feature_names) if m}
    return tuple(sorted(found)) if found else tuple(WINDOWS_DAYS)


@dataclass(frozen=True)
class KeyedRows:
    """Rows of some keys: an int64 key code, an int64 time (ns) and float64 value columns per row."""

    key: np.ndarray
    t: np.ndarray
    values: tuple[np.ndarray, ...]

    @classmethod
    def empty(cls, n_values: int) -> KeyedRows:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), tuple(np.zeros(0) for _ in range(n_values)))


def _distinct_sorted(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by sorting: numpy 2.4's ``np.unique`` of 815k int64 took 2.6 s, this 0.05 s."""
    ordered = np.sort(values)
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])] if len(ordered) else ordered


class _Timeline:
    """History rows then a chunk's rows, stably sorted by (key, time): a chunk row sees the history
    and the chunk rows before it at its time, and its key's rows are one contiguous run.

    Time is replaced by its dense rank among all times, so the composite key fits in int64.
    """

    def __init__(self, history: KeyedRows, chunk: KeyedRows) -> None:
        self.n_hist = len(history.t)
        keys = np.concatenate([history.key, chunk.key]).astype(np.int64)
        t = np.concatenate([history.t, chunk.t]).astype(np.int64)
        self.uniq_t = _distinct_sorted(t)
        self.stride = np.int64(len(self.uniq_t) + 1)
        composite = keys * self.stride + np.searchsorted(self.uniq_t, t)
        self.order = np.argsort(composite, kind="stable")
        self.sorted_key = composite[self.order]
        pos = np.empty(len(composite), dtype=np.int64)
        pos[self.order] = np.arange(len(composite))
        self.pos = pos[self.n_hist:]  # each chunk row's place in the sorted rows
        self.chunk_order = self.order[self.order >= self.n_hist] - self.n_hist  # chunk rows, as sorted
        self.chunk_key = chunk.key.astype(np.int64)
        self.t = t
        self.values = [np.concatenate([h, c]) for h, c in zip(history.values, chunk.values, strict=True)]

    def cumsum(self, j: int) -> np.ndarray:
        """Cumulative sums (with a leading 0) of value column ``j`` in sorted order."""
        return np.concatenate([[0.0], np.cumsum(self.values[j][self.order], dtype=np.float64)])

    def bound(self, t_ns: np.ndarray, side: str) -> np.ndarray:
        """Per chunk row, the sorted position of its key's first row with time >= ``t_ns``
        (``side="left"``) or > ``t_ns`` (``side="right"``)."""
        rank = np.searchsorted(self.uniq_t, t_ns, side=side)
        # queried in sorted order (ascending: numpy then narrows each search from the last; 2-3x faster)
        found = np.empty(len(t_ns), dtype=np.int64)
        ordered = self.chunk_order
        found[ordered] = np.searchsorted(self.sorted_key, (self.chunk_key * self.stride + rank)[ordered], side="left")
        return found


def row_features(amount: np.ndarray, hour: np.ndarray, dayofweek: np.ndarray) -> dict[str, np.ndarray]:
    """The row's own features (``hour``/``dayofweek`` of its local wall clock)."""
    hour = np.asarray(hour)
    return {
        "amount": amount,
        "log_amount": np.log1p(np.clip(amount, 0.0, None)),
        "hour": hour.astype(np.float64),
        "is_weekend": (np.asarray(dayofweek) >= 5).astype(np.float64),
        "is_night": ((hour >= NIGHT_HOURS[0]) | (hour < NIGHT_HOURS[1])).astype(np.float64),
    }


def static_features(age: np.ndarray, account_age_days: np.ndarray) -> np.ndarray:
    """The customer's static attributes as the sequence model reads them, shape ``(n, 2)``: the
    age as given, the account's age in days on a log scale (negative ages count as 0; NaN stays
    NaN: unknown)."""
    acc_age = np.asarray(account_age_days, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        log_acc_age = np.where(np.isnan(acc_age), np.nan, np.log1p(np.maximum(acc_age, 0.0)))
    return np.column_stack([np.asarray(age, dtype=np.float64), log_acc_age])


def account_windows(windows_days: Sequence[int], chunk: KeyedRows, history: KeyedRows | None = None,
                    max_rows: int | None = None) -> dict[str, np.ndarray]:
    """The account features of each chunk row (``chunk.values == (amount,)``, NaN when missing).

    Args:
        windows_days: window lengths in days.
        chunk: the new rows, in time order per account, none older than its account's history.
        history: the accounts' earlier rows (at least those inside ``max(windows_days)`` days).
        max_rows: at most this many earlier rows of an account are counted (the online state's
            bound on an account's rows); None: all.
    """
    wmax = max(windows_days)
    history = history if history is not None else KeyedRows.empty(1)
    line = _Timeline(KeyedRows(history.key, history.t, (np.nan_to_num(history.values[0]),)),
                     KeyedRows(chunk.key, chunk.t, (np.nan_to_num(chunk.values[0]),)))
    amount, t, p = chunk.values[0], chunk.t, line.pos
    cap_s = float(wmax) * 86_400.0
    prev = np.maximum(p - 1, 0)
    has_prev = (p > 0) & (line.sorted_key[prev] // line.stride == line.chunk_key)
    gap = np.where(has_prev, (t - line.t[line.order[prev]]) / NS_PER_S, cap_s)
    feats = {"secs_since_prev": np.minimum(gap, cap_s)}
    cs = line.cumsum(0)
    for w in windows_days:
        lo = line.bound(t - w * NS_PER_DAY, side="right")
        if max_rows is not None:
            lo = np.maximum(lo, p - max_rows)
        nb = (p + 1 - lo).astype(np.float64)
        feats[f"cust_nb_tx_{w}d"] = nb
        feats[f"cust_mean_amount_{w}d"] = (cs[p + 1] - cs[lo]) / nb
    mean_max = feats[f"cust_mean_amount_{wmax}d"]
    feats[f"amount_over_cust_mean_{wmax}d"] = np.divide(amount, mean_max, out=np.ones(len(t)), where=mean_max > 0)
    return feats


def terminal_windows(windows_days: Sequence[int], delay_days: int, chunk: KeyedRows,
                     history: KeyedRows | None = None) -> dict[str, np.ndarray]:
    """The delayed terminal features of each chunk row (``values == (label,)``, NaN when unknown).

    Args:
        windows_days: window lengths in days.
        delay_days: the label delay.
        chunk: the new rows, in time order.
        history: the terminals' earlier rows (at least those inside ``delay + max(windows_days)``
            days before the chunk's rows), any times, any order (sorted by (key, time), with a chunk
            shorter than the delay, the windows are searched in it without sorting).
    """
    history = history if history is not None else KeyedRows.empty(1)
    searched = _windows_of_history(windows_days, delay_days, chunk, history)
    return searched if searched is not None else _windows_of_timeline(windows_days, delay_days, chunk, history)


def _windows_of_timeline(windows_days: Sequence[int], delay_days: int, chunk: KeyedRows,
                         history: KeyedRows) -> dict[str, np.ndarray]:
    """:func:`terminal_windows` over the history and the chunk sorted together (any chunk, any order)."""
    label = [history.values[0], chunk.values[0]]
    known = [~np.isnan(v) for v in label]
    fraud = [k & (v > 0) for k, v in zip(known, label, strict=True)]
    line = _Timeline(KeyedRows(history.key, history.t, (known[0].astype(np.float64), fraud[0].astype(np.float64))),
                     KeyedRows(chunk.key, chunk.t, (known[1].astype(np.float64), fraud[1].astype(np.float64))))
    cs_known, cs_fraud = line.cumsum(0), line.cumsum(1)
    n = len(chunk.t)
    delay = int(delay_days) * NS_PER_DAY
    hi = line.bound(chunk.t - delay, side="left")
    feats: dict[str, np.ndarray] = {}
    for w in windows_days:
        lo = line.bound(chunk.t - delay - w * NS_PER_DAY, side="left")
        n_known = cs_known[hi] - cs_known[lo]
        feats[f"term_nb_tx_{w}d"] = (hi - lo).astype(np.float64)
        feats[f"term_risk_{w}d"] = np.divide(cs_fraud[hi] - cs_fraud[lo], n_known, out=np.zeros(n),
                                             where=n_known > 0)
    return feats


def _windows_of_history(windows_days: Sequence[int], delay_days: int, chunk: KeyedRows,
                        history: KeyedRows) -> dict[str, np.ndarray] | None:
    """:func:`terminal_windows` when every window reads the history alone, without sorting it; None
    when it cannot say (then the timeline computes them).

    That is when the chunk spans less than the delay (no chunk row is inside another's window, as for
    an online request) and the history is sorted by (key, time), as the online state reads it, one
    terminal after another: a row's window bounds are then searched in its key's run. The timeline
    sorts every history row, and a busy terminal keeps up to 20,000 of them: on a state holding a
    month of the bench's rows this took most of a request's time (issue 47).
    """
    n = len(chunk.t)
    delay = int(delay_days) * NS_PER_DAY
    if not n or not len(history.t) or int(chunk.t.max()) - int(chunk.t.min()) >= delay:
        return None
    hi_t = chunk.t - delay
    lowest = min(int(history.t.min()), int(hi_t.min()) - max(windows_days) * NS_PER_DAY)
    stride = max(int(history.t.max()), int(hi_t.max())) - lowest + 1
    keys = (int(history.key.min()), int(history.key.max()), int(chunk.key.min()), int(chunk.key.max()))
    if (max(map(abs, keys)) + 1) * stride >= 2**62:
        return None  # too many keys over too long a span for one int64 composite key
    line = np.asarray(history.key, np.int64) * stride  # (key, time) as one int64
    line += history.t
    line -= lowest
    if len(line) > 1 and not bool(np.all(line[1:] >= line[:-1])):
        return None
    label = history.values[0]
    known = ~np.isnan(label)
    cs_known, cs_fraud = np.zeros(len(line) + 1, np.int64), np.zeros(len(line) + 1, np.int64)
    np.cumsum(known, out=cs_known[1:])
    np.cumsum(label > 0, out=cs_fraud[1:])  # NaN > 0 is False: an unknown label is no fraud
    base = np.asarray(chunk.key, np.int64) * stride - lowest
    hi = np.searchsorted(line, base + hi_t, side="left")
    feats: dict[str, np.ndarray] = {}
    for w in windows_days:
        lo = np.searchsorted(line, base + hi_t - w * NS_PER_DAY, side="left")
        n_known = (cs_known[hi] - cs_known[lo]).astype(np.float64)
        feats[f"term_nb_tx_{w}d"] = (hi - lo).astype(np.float64)
        feats[f"term_risk_{w}d"] = np.divide((cs_fraud[hi] - cs_fraud[lo]).astype(np.float64), n_known,
                                             out=np.zeros(n), where=n_known > 0)
    return feats


STEP_NUMERIC = (
    "log_amount",
    "log_gap_s",
    "hour_sin",
    "hour_cos",
    "dow_sin",
    "dow_cos",
    "new_terminal",
    "log_amount_vs_mean",
    "is_first",
)
MAX_GAP_S = 30 * 86400.0


@dataclass(frozen=True)
class AccountSummary:
    """What the sequence steps need of each chunk account's earlier rows (one entry per account code):
    the count and sum of its known (clipped) amounts and the time of its latest row (None: none)."""

    n: np.ndarray
    total: np.ndarray
    latest: np.ndarray  # int64 ns; np.iinfo(np.int64).min where the account has no row

    @classmethod
    def empty(cls, n_keys: int) -> AccountSummary:
        return cls(np.zeros(n_keys, np.int64), np.zeros(n_keys), np.full(n_keys, np.iinfo(np.int64).min, np.int64))


def step_features(chunk: KeyedRows, hour: np.ndarray, dayofweek: np.ndarray, terminal: np.ndarray | None,
                  history: AccountSummary | None = None, known_pair: np.ndarray | None = None) -> np.ndarray:
    """The sequence steps of each chunk row, float64 ``[n, len(STEP_NUMERIC)]``.

    Args:
        chunk: the new rows (``values == (amount,)``), in time order per account; ``key`` codes
            ``0..k-1`` index ``history``.
        hour: the local hour of each row, with minutes as a fraction.
        dayofweek: the local weekday (Monday 0).
        terminal: int64 terminal codes (-1: no terminal), or None without terminals.
        history: the accounts' earlier rows, summarised; None: none.
        known_pair: whether the row's (account, terminal) pair occurs in the history; None: never.
    """
    n = len(chunk.t)
    key = chunk.key.astype(np.int64)
    history = history if history is not None else AccountSummary.empty(int(key.max()) + 1 if n else 0)
    amount = np.clip(chunk.values[0], 0.0, None)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.r_[True, sk[1:] != sk[:-1]] if n else np.zeros(0, bool)
    first_of_key = np.maximum.accumulate(np.where(starts, np.arange(n), 0))  # sorted position of its key's first row
    known = ~np.isnan(amount[order])
    cs_amount = np.concatenate([[0.0], np.cumsum(np.where(known, amount[order], 0.0))])
    cs_known = np.concatenate([[0], np.cumsum(known)])
    idx = np.arange(n)
    prior_sum = np.empty(n)
    prior_n = np.empty(n, np.int64)
    prior_sum[order] = history.total[sk] + (cs_amount[idx] - cs_amount[first_of_key])
    prior_n[order] = history.n[sk] + (cs_known[idx] - cs_known[first_of_key])
    prev_t = np.empty(n, np.int64)
    t_sorted = chunk.t[order]
    prev_t[order] = np.where(starts, history.latest[sk], np.roll(t_sorted, 1))
    is_first = prev_t == np.iinfo(np.int64).min
    gap = np.where(is_first, MAX_GAP_S, (chunk.t - np.where(is_first, chunk.t, prev_t)) / NS_PER_S)
    with np.errstate(invalid="ignore", divide="ignore"):
        prior_mean = np.where(prior_n > 0, prior_sum / np.maximum(prior_n, 1), amount)
    new_terminal = np.zeros(n, bool)
    if terminal is not None:
        has = terminal >= 0
        pair = key * (int(terminal.max(initial=0)) + 2) + (terminal + 1)
        first_seen = np.zeros(n, bool)
        first_seen[np.unique(pair, return_index=True)[1]] = True
        new_terminal = has & first_seen & (~known_pair if known_pair is not None else True)
    log_amount = np.log1p(amount)
    hour = np.asarray(hour, dtype=np.float64)
    dow = np.asarray(dayofweek, dtype=np.float64)
    return np.column_stack([
        log_amount,
        np.log1p(np.clip(gap, 0.0, MAX_GAP_S)),
        np.sin(2 * np.pi * hour / 24),
        np.cos(2 * np.pi * hour / 24),
        np.sin(2 * np.pi * dow / 7),
        np.cos(2 * np.pi * dow / 7),
        new_terminal.astype(np.float64),
        log_amount - np.log1p(prior_mean),
        is_first.astype(np.float64),
    ]) if n else np.zeros((0, len(STEP_NUMERIC)))
