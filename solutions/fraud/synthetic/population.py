"""The synthetic fraud world: terminals and accounts on a 2-D map, and the accounts' legit spending.

Part of :mod:`solutions.fraud.synthetic` (its docstring describes the behaviour simulated): the
vocabularies (channels, categories, occupations, scenarios), the account and terminal populations,
the sampling helpers every scenario shares, and the legit transactions (habits, trips, sessions).
Transactions are blocks of parallel arrays (:class:`Tx`); every draw comes from the caller's
generator, in a fixed order, so a seed gives one frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DAY = 86_400
HOUR = 3_600

CHANNELS: tuple[str, ...] = ("pos", "online", "atm")
POS, ONLINE, ATM = 0, 1, 2

CATEGORIES: tuple[str, ...] = (
    "grocery",
    "restaurant",
    "fuel",
    "retail",
    "pharmacy",
    "entertainment",
    "electronics",
    "travel",
    "online_retail",
    "digital_goods",
    "subscriptions",
    "cash",
)
CAT = {name: i for i, name in enumerate(CATEGORIES)}
# Typical amount of a category relative to the account's typical amount.
CAT_FACTOR = np.array([0.8, 0.7, 1.1, 1.5, 0.6, 1.0, 3.0, 4.0, 1.3, 0.25, 0.45, 2.0])
POS_CATS = (
    np.array(
        [
            CAT[c]
            for c in (
                "grocery",
                "restaurant",
                "fuel",
                "retail",
                "pharmacy",
                "entertainment",
                "electronics",
                "travel",
            )
        ]
    ),
    np.array([0.25, 0.22, 0.12, 0.18, 0.08, 0.08, 0.05, 0.02]),
)
ONLINE_CATS = (
    np.array([CAT[c] for c in ("online_retail", "digital_goods", "subscriptions", "travel", "electronics")]),
    np.array([0.40, 0.20, 0.15, 0.12, 0.13]),
)

OCCUPATIONS: tuple[str, ...] = (
    "employee",
    "self_employed",
    "executive",
    "student",
    "retired",
    "unemployed",
)

SCENARIOS: tuple[str, ...] = (
    "",
    "card_testing",
    "account_takeover",
    "compromised_terminal",
    "velocity_burst",
    "stealth",
    "new_pattern",
)
LEGIT, CARD, ATO, TERM, VELO, STEALTH, NEW = range(len(SCENARIOS))

# Relative activity per hour of day (index = hour).
# fmt: off
HOURS_WEEKDAY = np.array(
    [0.30, 0.20, 0.15, 0.10, 0.10, 0.20, 0.50, 1.20, 2.00, 2.50, 2.80, 3.00,
     3.50, 3.20, 2.80, 2.70, 2.90, 3.30, 3.60, 3.20, 2.50, 1.80, 1.10, 0.60]
)
HOURS_WEEKEND = np.array(
    [0.60, 0.45, 0.30, 0.15, 0.10, 0.10, 0.20, 0.50, 1.00, 1.80, 2.60, 3.20,
     3.50, 3.50, 3.40, 3.30, 3.20, 3.20, 3.30, 3.00, 2.60, 2.00, 1.40, 0.90]
)
# fmt: on

K_POS, K_ATM, K_ONLINE = 8, 2, 5


@dataclass
class Terminals:
    loc: np.ndarray  # (T, 2)
    channel: np.ndarray  # (T,)
    category: np.ndarray  # (T,)
    popularity: np.ndarray  # (T,) relative popularity (used for online merchants)


@dataclass
class Accounts:
    loc: np.ndarray
    mean_amount: np.ndarray
    sigma: np.ndarray
    rate: np.ndarray
    weekend_factor: np.ndarray
    hour_shift: np.ndarray
    channel_cum: np.ndarray  # (A, 3) cumulative channel preference
    pos: np.ndarray  # (A, K_POS) terminal ids
    pos_cum: np.ndarray  # (A, K_POS) cumulative weights
    atm: np.ndarray
    atm_cum: np.ndarray
    online: np.ndarray
    online_cum: np.ndarray
    trip_start: np.ndarray  # day, -1 if no trip
    trip_len: np.ndarray
    trip_pos: np.ndarray  # (A, K_POS) terminals at the trip destination
    trip_atm: np.ndarray
    age: np.ndarray
    occupation: np.ndarray
    account_age_days: np.ndarray


@dataclass
class Tx:
    """A block of transactions as parallel arrays (time in seconds from start)."""

    account: np.ndarray
    t: np.ndarray
    terminal: np.ndarray
    amount: np.ndarray
    scenario: np.ndarray

    def __len__(self) -> int:
        return len(self.t)

    @classmethod
    def make(
        cls,
        account: np.ndarray,
        t: np.ndarray,
        terminal: np.ndarray,
        amount: np.ndarray,
        scenario: int,
    ) -> Tx:
        return cls(
            account.astype(np.int64),
            t.astype(np.int64),
            terminal.astype(np.int64),
            amount.astype(np.float64),
            np.full(len(t), scenario, dtype=np.int8),
        )


def cum_weights(rng: np.random.Generator, shape: tuple[int, int], alpha: float) -> np.ndarray:
    w = rng.dirichlet(np.full(shape[1], alpha), size=shape[0])
    cum = np.cumsum(w, axis=1)
    cum[:, -1] = 1.0
    return cum


def pick(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Row-wise categorical draw: index of the first cumulative weight >= u."""
    return np.minimum((u[:, None] > cum).sum(axis=1), cum.shape[1] - 1)


def nearest(
    points: np.ndarray,
    cand_loc: np.ndarray,
    cand_ids: np.ndarray,
    k: int,
    rng: np.random.Generator,
    jitter: float,
) -> np.ndarray:
    """For each point, ``k`` candidates drawn towards the nearest (noisy top-k)."""
    k = min(k, len(cand_ids))
    d = np.sqrt(((points[:, None, :] - cand_loc[None, :, :]) ** 2).sum(-1))
    keys = d + rng.gumbel(size=d.shape) * jitter
    idx = np.argpartition(keys, k - 1, axis=1)[:, :k]
    return cand_ids[idx]


def sample_hours(rng: np.random.Generator, n: int, profile: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(profile / profile.sum())
    cdf[-1] = 1.0
    return np.searchsorted(cdf, rng.random(n), side="right")


def make_terminals(rng: np.random.Generator, n: int) -> Terminals:
    loc = rng.uniform(0, 100, size=(n, 2))
    channel = rng.choice(3, size=n, p=[0.65, 0.25, 0.10])
    category = np.empty(n, dtype=np.int64)
    for ch, (cats, p) in ((POS, POS_CATS), (ONLINE, ONLINE_CATS)):
        m = channel == ch
        category[m] = rng.choice(cats, size=m.sum(), p=p)
    category[channel == ATM] = CAT["cash"]
    popularity = rng.pareto(1.2, size=n) + 1.0
    # Guarantee every channel exists, even for tiny terminal counts.
    for ch in range(3):
        if not (channel == ch).any():
            channel[ch % n] = ch
            category[ch % n] = (
                CAT["cash"] if ch == ATM else (CAT["grocery"] if ch == POS else CAT["online_retail"])
            )
    return Terminals(loc, channel, category, popularity)


def make_accounts(rng: np.random.Generator, n: int, n_days: int, term: Terminals) -> Accounts:
    loc = rng.uniform(0, 100, size=(n, 2))
    age = np.clip(np.round(18 + rng.gamma(3.0, 9.0, size=n)), 18, 90).astype(np.int64)
    occ_p = np.where(
        (age < 25)[:, None],
        [0.35, 0.05, 0.0, 0.50, 0.0, 0.10],
        np.where(
            (age >= 66)[:, None], [0.08, 0.05, 0.02, 0.0, 0.82, 0.03], [0.58, 0.15, 0.08, 0.02, 0.05, 0.12]
        ),
    )
    occupation = pick(np.cumsum(occ_p, axis=1), rng.random(n))
    occ_amount = np.array([1.0, 1.15, 1.8, 0.55, 0.8, 0.6])[occupation]
    mean_amount = np.exp(rng.normal(3.3, 0.55, size=n)) * occ_amount
    sigma = rng.uniform(0.3, 0.65, size=n)
    rate = np.clip(rng.gamma(4.0, 0.5, size=n), 0.5, 4.0)
    weekend_factor = rng.uniform(0.6, 1.5, size=n)
    hour_shift = rng.choice([0, 2, 3, -1, -2], size=n, p=[0.75, 0.08, 0.04, 0.08, 0.05])
    max_account_age = np.maximum((age - 17) * 365, 60)
    account_age_days = np.round(rng.uniform(0.02, 1.0, size=n) ** 1.5 * max_account_age).astype(np.int64)
    account_age_days = np.maximum(account_age_days, 14)

    # Channel habits: younger people buy online more, ATMs are for a minority.
    online_alpha = np.where(age < 35, 3.0, np.where(age < 60, 1.8, 0.8))
    alpha = np.stack([np.full(n, 6.0), online_alpha, np.full(n, 0.9)], axis=1)
    pref = rng.gamma(alpha)
    pref /= pref.sum(axis=1, keepdims=True)
    channel_cum = np.cumsum(pref, axis=1)
    channel_cum[:, -1] = 1.0

    pos_ids = np.flatnonzero(term.channel == POS)
    atm_ids = np.flatnonzero(term.channel == ATM)
    online_ids = np.flatnonzero(term.channel == ONLINE)
    pos = nearest(loc, term.loc[pos_ids], pos_ids, K_POS, rng, jitter=4.0)
    atm = nearest(loc, term.loc[atm_ids], atm_ids, K_ATM, rng, jitter=4.0)
    # Online merchants: popularity-weighted draw without replacement (Gumbel top-k).
    k_on = min(K_ONLINE, len(online_ids))
    keys = np.log(term.popularity[online_ids])[None, :] + rng.gumbel(size=(n, len(online_ids)))
    online = online_ids[np.argpartition(-keys, k_on - 1, axis=1)[:, :k_on]]

    # Trips: ~10% of accounts spend a few days far away.
    trip = rng.random(n) < 0.10
    trip_start = np.where(trip, rng.integers(0, max(n_days - 2, 1), size=n), -1)
    trip_len = rng.integers(2, 8, size=n)
    dest = rng.uniform(0, 100, size=(n, 2))
    trip_pos = nearest(dest, term.loc[pos_ids], pos_ids, K_POS, rng, jitter=4.0)
    trip_atm = nearest(dest, term.loc[atm_ids], atm_ids, K_ATM, rng, jitter=4.0)

    return Accounts(
        loc=loc,
        mean_amount=mean_amount,
        sigma=sigma,
        rate=rate,
        weekend_factor=weekend_factor,
        hour_shift=hour_shift,
        channel_cum=channel_cum,
        pos=pos,
        pos_cum=cum_weights(rng, pos.shape, 0.7),
        atm=atm,
        atm_cum=cum_weights(rng, atm.shape, 1.0),
        online=online,
        online_cum=cum_weights(rng, online.shape, 0.7),
        trip_start=trip_start,
        trip_len=trip_len,
        trip_pos=trip_pos,
        trip_atm=trip_atm,
        age=age,
        occupation=occupation,
        account_age_days=account_age_days,
    )


def on_trip(acc: Accounts, a: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Whether account ``a`` is away on its trip on ``day``."""
    start = acc.trip_start[a]
    return (start >= 0) & (day >= start) & (day < start + acc.trip_len[a])


def habitual_terminals(
    rng: np.random.Generator, acc: Accounts, a: np.ndarray, day: np.ndarray
) -> np.ndarray:
    """Terminals an account would normally use (channel habit, trips included)."""
    n = len(a)
    ch = pick(acc.channel_cum[a], rng.random(n))
    u = rng.random(n)
    in_trip = on_trip(acc, a, day)
    i_pos = pick(acc.pos_cum[a], u)
    i_atm = pick(acc.atm_cum[a], u)
    i_on = pick(acc.online_cum[a], u)
    pos_t = np.where(in_trip, acc.trip_pos[a, i_pos], acc.pos[a, i_pos])
    atm_t = np.where(in_trip, acc.trip_atm[a, i_atm], acc.atm[a, i_atm])
    on_t = acc.online[a, i_on]
    return np.select([ch == POS, ch == ATM], [pos_t, atm_t], on_t)


def habitual_amounts(
    rng: np.random.Generator, acc: Accounts, term: Terminals, a: np.ndarray, terminal: np.ndarray
) -> np.ndarray:
    s = acc.sigma[a]
    cat = term.category[terminal]
    amount = acc.mean_amount[a] * CAT_FACTOR[cat] * np.exp(s * rng.standard_normal(len(a)) - s * s / 2)
    atm = term.channel[terminal] == ATM
    amount[atm] = np.maximum(20.0, np.round(amount[atm] / 20.0) * 20.0)
    return amount


def legit_transactions(rng: np.random.Generator, acc: Accounts, term: Terminals, n_days: int, start_dow: int) -> Tx:
    n_acc = len(acc.rate)
    weekend = ((start_dow + np.arange(n_days)) % 7) >= 5
    lam = acc.rate[:, None] * np.where(weekend[None, :], acc.weekend_factor[:, None], 1.0)
    counts = rng.poisson(lam).ravel()
    a = np.repeat(np.repeat(np.arange(n_acc), n_days), counts)
    day = np.repeat(np.tile(np.arange(n_days), n_acc), counts)
    n = len(a)

    we = weekend[day]
    hour = np.where(
        we,
        sample_hours(rng, n, HOURS_WEEKEND),
        sample_hours(rng, n, HOURS_WEEKDAY),
    )
    hour = (hour + acc.hour_shift[a]) % 24
    t = day.astype(np.int64) * DAY + hour * HOUR + rng.integers(0, HOUR, size=n)

    terminal = habitual_terminals(rng, acc, a, day)
    # New merchants: some purchases at a terminal of the same channel anywhere.
    new = rng.random(n) < 0.04
    if new.any():
        ch = term.channel[terminal[new]]
        repl = np.empty(new.sum(), dtype=np.int64)
        for c in range(3):
            ids = np.flatnonzero(term.channel == c)
            m = ch == c
            repl[m] = rng.choice(ids, size=m.sum())
        terminal[new] = repl
    amount = habitual_amounts(rng, acc, term, a, terminal)

    # Occasional large legit purchases and tiny legit amounts (parking, app stores).
    big = rng.random(n) < 0.004
    amount[big] *= np.exp(rng.normal(1.8, 0.5, size=big.sum()))
    tiny = (rng.random(n) < 0.012) & (term.channel[terminal] != ATM)
    amount[tiny] = rng.uniform(0.5, 5.0, size=tiny.sum())

    base = Tx.make(a, t, terminal, amount, LEGIT)

    # Legit shopping sessions: a few more purchases within the next hour nearby.
    spawn = np.flatnonzero(rng.random(n) < 0.025)
    extra = rng.integers(1, 5, size=len(spawn))
    src = np.repeat(spawn, extra)
    step = rng.exponential(8 * 60, size=len(src)) + 60
    # Cumulative offsets within each session.
    grp_start = np.repeat(np.cumsum(extra) - extra, extra)
    cs = np.cumsum(step)
    offset = cs - np.concatenate([[0.0], cs])[grp_start]
    sa = a[src]
    k = rng.integers(0, acc.pos.shape[1], size=len(src))
    # Mostly more shops of the same kind nearby (at the trip destination when away).
    near_pos = np.where(on_trip(acc, sa, day[src]), acc.trip_pos[sa, k], acc.pos[sa, k])
    sterm = np.where(
        rng.random(len(src)) < 0.8,
        np.where(term.channel[terminal[src]] == POS, near_pos, terminal[src]),
        habitual_terminals(rng, acc, sa, day[src]),
    )
    session = Tx.make(
        sa, t[src] + offset.astype(np.int64), sterm, habitual_amounts(rng, acc, term, sa, sterm), LEGIT
    )
    return concat([base, session])


def concat(parts: list[Tx]) -> Tx:
    return Tx(
        *(
            np.concatenate([getattr(p, f) for p in parts])
            for f in ("account", "t", "terminal", "amount", "scenario")
        )
    )

