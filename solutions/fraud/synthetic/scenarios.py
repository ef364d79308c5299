"""The fraud scenarios of the synthetic data: each adds fraud transactions to the legit ones (card
testing, account takeover, velocity bursts, stealth fraud, the new pattern) or turns legit ones into
fraud (compromised terminals); :mod:`solutions.fraud.synthetic`'s docstring describes each."""

from __future__ import annotations

import numpy as np

from solutions.fraud.synthetic.population import (
    ATM,
    ATO,
    CARD,
    DAY,
    HOUR,
    HOURS_WEEKDAY,
    NEW,
    ONLINE,
    POS,
    STEALTH,
    TERM,
    VELO,
    Accounts,
    Terminals,
    Tx,
    habitual_amounts,
    habitual_terminals,
    nearest,
    sample_hours,
)

# Share of the fraud budget given to each old scenario.
SHARE = {CARD: 0.20, ATO: 0.30, TERM: 0.31, VELO: 0.14, STEALTH: 0.05}
# Share of transactions in the last 30% of the span added as ``new_pattern`` fraud.
NEW_PATTERN_RATE = 0.004
# Fraudsters keep less regular hours: half the legit profile, half uniform.
_HOURS_FRAUD = 0.5 * HOURS_WEEKDAY / HOURS_WEEKDAY.sum() + 0.5 / 24
# Account takeovers are often run from other time zones: even flatter.
_HOURS_ATO = 0.3 * HOURS_WEEKDAY / HOURS_WEEKDAY.sum() + 0.7 / 24


def _event_starts(
    rng: np.random.Generator, n: int, day_lo: int, day_hi: int, profile: np.ndarray = _HOURS_FRAUD
) -> tuple[np.ndarray, np.ndarray]:
    day = rng.integers(day_lo, max(day_hi, day_lo + 1), size=n)
    t = day * DAY + sample_hours(rng, n, profile) * HOUR + rng.integers(0, HOUR, size=n)
    return day, t.astype(np.int64)


def _random_terminals(
    rng: np.random.Generator, term: Terminals, channel: int, n: int, popular: bool = False
) -> np.ndarray:
    ids = np.flatnonzero(term.channel == channel)
    p = term.popularity[ids] / term.popularity[ids].sum() if popular else None
    return rng.choice(ids, size=n, p=p)


def card_testing(
    rng: np.random.Generator, acc: Accounts, term: Terminals, n_events: int, n_days: int
) -> Tx:
    a_ev = rng.integers(0, len(acc.rate), size=n_events)
    _, t0 = _event_starts(rng, n_events, 0, n_days)
    n_tests = rng.integers(2, 6, size=n_events)
    size = n_tests + 1
    a = np.repeat(a_ev, size)
    ev = np.repeat(np.arange(n_events), size)
    pos_in = np.arange(len(a)) - np.repeat(np.cumsum(size) - size, size)
    is_final = pos_in == np.repeat(n_tests, size)
    step = np.where(
        is_final, rng.exponential(25 * 60, size=len(a)) + 120, rng.exponential(70, size=len(a)) + 5
    )
    step[pos_in == 0] = 0.0
    cs = np.cumsum(step)
    offset = cs - cs[np.repeat(np.cumsum(size) - size, size)]
    t = t0[ev] + offset.astype(np.int64)
    # Tests at one online merchant per event; the cash-out at a random merchant.
    test_term = _random_terminals(rng, term, ONLINE, n_events, popular=True)[ev]
    cash_ch = rng.random(len(a)) < 0.75
    cash_term = np.where(
        cash_ch,
        _random_terminals(rng, term, ONLINE, len(a), popular=True),
        _random_terminals(rng, term, POS, len(a)),
    )
    terminal = np.where(is_final, cash_term, test_term)
    u = rng.uniform(1.0, 5.0, size=len(a))
    tiny = np.where(rng.random(len(a)) < 0.5, np.round(u), np.round(u, 2))
    large = np.maximum(
        acc.mean_amount[a] * np.exp(rng.normal(1.2, 0.6, size=len(a))), rng.uniform(60, 400, size=len(a))
    )
    amount = np.where(is_final, large, tiny)
    return Tx.make(a, t, terminal, amount, CARD)


def account_takeover(
    rng: np.random.Generator, acc: Accounts, term: Terminals, n_events: int, n_days: int
) -> Tx:
    a_ev = rng.integers(0, len(acc.rate), size=n_events)
    day0, _ = _event_starts(rng, n_events, 0, n_days)
    dur = rng.integers(1, 7, size=n_events)
    size = 1 + rng.poisson(2.0 * dur)
    ev = np.repeat(np.arange(n_events), size)
    a = a_ev[ev]
    day = day0[ev] + rng.integers(0, dur[ev])
    t = day * DAY + sample_hours(rng, len(a), _HOURS_ATO) * HOUR + rng.integers(0, HOUR, size=len(a))
    online = rng.random(len(a)) < 0.75
    terminal = np.where(
        online,
        _random_terminals(rng, term, ONLINE, len(a), popular=True),
        _random_terminals(rng, term, POS, len(a)),
    )
    # The takeover keeps mostly to one new channel mix per event; amounts higher.
    amount = habitual_amounts(rng, acc, term, a, terminal) * np.exp(rng.normal(1.7, 0.5, size=len(a)))
    return Tx.make(a, t, terminal, amount, ATO)


def velocity(rng: np.random.Generator, acc: Accounts, term: Terminals, n_events: int, n_days: int) -> Tx:
    a_ev = rng.integers(0, len(acc.rate), size=n_events)
    _, t0 = _event_starts(rng, n_events, 0, n_days)
    size = rng.integers(6, 16, size=n_events)
    ev = np.repeat(np.arange(n_events), size)
    a = a_ev[ev]
    first = np.repeat(np.cumsum(size) - size, size)
    step = rng.exponential(2 * 60, size=len(a)) + 10
    step[np.arange(len(a)) == first] = 0.0
    cs = np.cumsum(step)
    t = t0[ev] + (cs - cs[first]).astype(np.int64)
    # A cloned card used around a random place: nearby POS terminals and ATMs.
    place = rng.uniform(0, 100, size=(n_events, 2))
    pos_ids = np.flatnonzero(term.channel == POS)
    atm_ids = np.flatnonzero(term.channel == ATM)
    near_pos = nearest(place, term.loc[pos_ids], pos_ids, 6, rng, jitter=3.0)
    near_atm = nearest(place, term.loc[atm_ids], atm_ids, 2, rng, jitter=3.0)
    use_atm = rng.random(len(a)) < 0.25
    terminal = np.where(
        use_atm,
        near_atm[ev, rng.integers(0, near_atm.shape[1], size=len(a))],
        near_pos[ev, rng.integers(0, near_pos.shape[1], size=len(a))],
    )
    amount = habitual_amounts(rng, acc, term, a, terminal) * np.exp(rng.normal(0.7, 0.4, size=len(a)))
    return Tx.make(a, t, terminal, amount, VELO)


def stealth(rng: np.random.Generator, acc: Accounts, term: Terminals, n_events: int, n_days: int) -> Tx:
    a = rng.integers(0, len(acc.rate), size=n_events)
    day, _ = _event_starts(rng, n_events, 0, n_days)
    hour = (sample_hours(rng, n_events, HOURS_WEEKDAY) + acc.hour_shift[a]) % 24
    t = day * DAY + hour * HOUR + rng.integers(0, HOUR, size=n_events)
    terminal = habitual_terminals(rng, acc, a, day)
    return Tx.make(a, t, terminal, habitual_amounts(rng, acc, term, a, terminal), STEALTH)


def new_pattern_fraud(
    rng: np.random.Generator, acc: Accounts, term: Terminals, n_events: int, day_lo: int, n_days: int
) -> Tx:
    """Contactless limit structuring with a stolen card (see the module docstring)."""
    a_ev = rng.integers(0, len(acc.rate), size=n_events)
    day0, _ = _event_starts(rng, n_events, day_lo, n_days)
    dur = rng.integers(1, 3, size=n_events)
    size = rng.integers(4, 11, size=n_events)
    ev = np.repeat(np.arange(n_events), size)
    a = a_ev[ev]
    day = np.minimum(day0[ev] + rng.integers(0, dur[ev]), n_days - 1)
    hour = sample_hours(rng, len(a), HOURS_WEEKDAY)
    t = day * DAY + hour * HOUR + rng.integers(0, HOUR, size=len(a))
    # The thief shops around the victim's home: POS terminals near the account.
    pos_ids = np.flatnonzero(term.channel == POS)
    near = nearest(acc.loc[a_ev], term.loc[pos_ids], pos_ids, 12, rng, jitter=6.0)
    terminal = near[ev, rng.integers(0, near.shape[1], size=len(a))]
    amount = np.round(rng.uniform(45.0, 49.99, size=len(a)), 2)
    return Tx.make(a, t, terminal, amount, NEW)


def compromise_terminals(
    rng: np.random.Generator, tx: Tx, label: np.ndarray, term: Terminals, target: int, n_days: int
) -> None:
    """Turns a share of transactions at compromised POS terminals into fraud, in place.

    Compromises start on a jittered, evenly spaced grid of days so that every part
    of the time span sees some, and stop once ``target`` transactions are fraud.
    """
    n_term = len(term.channel)
    order = np.argsort(tx.terminal, kind="stable")
    bounds = np.searchsorted(tx.terminal[order], np.arange(n_term + 1))
    volume = np.diff(bounds)
    # Skimmers go to small shops: POS terminals with at most the median traffic.
    pos = np.flatnonzero((term.channel == POS) & (volume > 0))
    if len(pos) == 0:
        return
    candidates = pos[volume[pos] <= np.median(volume[pos])]
    traffic = volume[candidates].mean() / n_days
    lengths = (21, 43)
    shares = (0.8, 1.0)
    per_event = max(traffic * np.mean(lengths) * np.mean(shares), 1.0)
    n_events = max(1, int(np.ceil(target / per_event)))
    # Start days on a grid, earliest ones reaching back before the span.
    grid = (np.arange(n_events) + rng.random(n_events)) * (n_days + 14) / n_events - 14
    done = 0
    for day0 in np.concatenate([rng.permutation(grid), rng.uniform(-14, n_days, 10 * n_events)]):
        if done >= target:
            break
        k = int(rng.choice(candidates))
        rows = order[bounds[k] : bounds[k + 1]]
        length = int(rng.integers(*lengths))
        share = rng.uniform(*shares)
        tk = tx.t[rows]
        lo, hi = day0 * DAY, (day0 + length) * DAY
        in_win = rows[(tk >= lo) & (tk < hi) & (label[rows] == 0)]
        hit = in_win[rng.random(len(in_win)) < share][: max(target - done, 0)]
        if len(hit) == 0:
            continue
        label[hit] = 1
        tx.scenario[hit] = TERM
        tx.amount[hit] *= np.exp(rng.normal(0.5, 0.3, size=len(hit)))
        done += len(hit)

