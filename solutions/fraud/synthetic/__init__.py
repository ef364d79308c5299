"""Synthetic card-transaction generator with realistic, hard-to-separate fraud.

The simulator follows the spirit of the ULB/Worldline fraud-detection handbook
simulator (accounts and terminals on a 2-D map, accounts spend at nearby
terminals) and adds the habits, seasonality, legit noise and mixed fraud
scenarios that keep a model honest:

Legit behaviour
    * Every account has a typical amount (lognormal across accounts), an amount
      spread, a spending rate (0.5-4 transactions/day, mean ~2), a weekend factor,
      preferred channels (``pos`` / ``online`` / ``atm``), a handful of preferred
      nearby point-of-sale terminals and ATMs, a few preferred online merchants,
      and static attributes (age 18-90, occupation, account age in days).
    * Timing has a daily cycle (few transactions at night) that differs between
      weekdays and weekends; some accounts are night owls or early birds.
    * Noise that defeats single rules: occasional large legit purchases, tiny legit
      amounts (parking, app stores), trips that move an account's card-present
      spending to far-away terminals, purchases at new merchants, and short legit
      shopping sessions of several transactions within an hour.

Fraud scenarios (column ``scenario``; ``""`` for legit)
    * ``card_testing`` (~20% of fraud): 2-5 tiny online amounts (1-5) about a minute
      apart at one merchant, then one large purchase minutes later; all fraud.
    * ``account_takeover`` (~30%): for 1-6 days a compromised account also spends
      through new terminals, mostly online and at odd hours, at several times its
      usual amounts, while the owner keeps spending normally.
    * ``compromised_terminal`` (~31%): a small-shop POS terminal is skimmed for
      21-42 days and 80-100% of its transactions in that window are fraud (amounts
      only mildly inflated). Start days are spread over the whole span.
    * ``velocity_burst`` (~14%): 6-15 transactions a couple of minutes apart at POS
      terminals and ATMs around a random place (a cloned card).
    * ``stealth`` (~5%): label noise by design; fraud whose amount, time and
      terminal look like the account's normal behaviour.

    Card testing and velocity bursts are sequences: single transactions of them
    (a tiny amount, the first purchase of a burst) look ordinary, so models that
    read the account's ordered history have signal the window features lack.
    * ``new_pattern`` (only with ``new_pattern=True``, only in the last 30% of the
      time span): *contactless limit structuring* - a stolen card is used for 4-10
      card-present purchases of 45.00-49.99, just under a 50 no-PIN contactless
      limit, over 1-2 days in daytime, at POS terminals around the victim's home.
      Each amount is ordinary; the signal is the repetition of near-limit amounts
      in the account's sequence. None of the old scenarios looks like this (no
      large amounts, no online channel, no night time, no tight burst), so a model
      trained on earlier data catches it poorly; it is meant for drift detection
      and fine-tuning experiments.

Fraud is injected as extra transactions (card testing, account takeover,
velocity, stealth, new pattern) or by turning legit transactions into fraud
(compromised terminal), mixed so the overall fraud share is about ``fraud_rate``.
Everything is vectorised with numpy and drawn from one seeded generator.

Modules: :mod:`.population` (terminals, accounts and their legit spending), :mod:`.scenarios`
(the fraud scenarios); this one puts them together (:func:`generate_transactions`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solutions.fraud.schema import (
    ACCOUNT_AGE_DAYS,
    ACCOUNT_ID,
    AGE,
    AMOUNT,
    CATEGORY,
    CHANNEL,
    LABEL,
    OCCUPATION,
    SCENARIO,
    TERMINAL_ID,
    TIMESTAMP,
    TRANSACTION_ID,
)
from solutions.fraud.synthetic.population import (
    ATO,
    CARD,
    CATEGORIES,
    CHANNELS,
    DAY,
    OCCUPATIONS,
    SCENARIOS,
    STEALTH,
    TERM,
    VELO,
    concat,
    legit_transactions,
    make_accounts,
    make_terminals,
)
from solutions.fraud.synthetic.scenarios import (
    NEW_PATTERN_RATE,
    SHARE,
    account_takeover,
    card_testing,
    compromise_terminals,
    new_pattern_fraud,
    stealth,
    velocity,
)

__all__ = [
    "CATEGORIES",
    "CHANNELS",
    "OCCUPATIONS",
    "SCENARIOS",
    "generate_transactions",
]


def generate_transactions(
    n_accounts: int = 3000,
    n_terminals: int = 1000,
    n_days: int = 58,
    start: str = "2025-01-01",
    fraud_rate: float = 0.01,
    seed: int = 0,
    new_pattern: bool = False,
    new_pattern_rate: float = NEW_PATTERN_RATE,
    new_pattern_from: float = 0.7,
) -> pd.DataFrame:
    """Generates a labelled synthetic card-transaction table.

    See the module docstring for the behaviour that is simulated. With the
    defaults (3000 accounts, 58 days) the frame has about 370k rows and a fraud
    share of about 1%. Under the handbook protocol (test = last 7 days, 7 days of
    label delay before it, train = the 14 days before that) the
    :class:`~solutions.fraud.features.WindowFeatureBaseline` on
    :class:`~solutions.fraud.features.WindowFeatures` measured ROC-AUC 0.90-0.94
    and average precision 0.40-0.60 over seeds 0-4, so the data is learnable but
    not trivially separable; adding a few features of the account's ordered
    history (previous amounts, new terminal/channel) raised average precision by
    ~0.17, room that a sequence model can take.

    ``new_pattern=True`` adds fraud of scenario ``"new_pattern"`` (contactless
    limit structuring: 4-10 POS purchases of 45.00-49.99 over 1-2 days, in
    daytime, near the victim's home) whose events start in the last 30% of the
    time span only (from day ``ceil(0.7 * n_days)``). It is unlike every earlier
    scenario, so a model trained on the earlier data catches it poorly; use it to
    test drift detection and fine-tuning. It adds roughly 0.4% fraud to that
    period; all other rows are identical to those of ``new_pattern=False`` (only
    ``transaction_id`` shifts). Measured (seed 0): a baseline trained on days
    20-40 scored the new pattern's rows ROC-AUC 0.74 / AP 0.02, one trained on
    days 30-43 (three days of the new pattern) 0.88 / 0.08.

    Args:
        n_accounts: number of accounts (card holders).
        n_terminals: number of terminals (POS terminals, online merchants, ATMs).
        n_days: length of the time span in days.
        start: first day (anything ``pd.Timestamp`` accepts).
        fraud_rate: target share of fraudulent transactions among the old
            scenarios, in (0, 0.5); the realised share is close to it for rates
            up to a few percent (larger ones may fall short on compromised
            terminals).
        seed: seed of the random generator; the same arguments give an identical
            frame.
        new_pattern: add the ``new_pattern`` scenario in the last 30% of the span.
        new_pattern_rate: new-pattern fraud as a share of the transactions of its
            period (default 0.4%; a larger share makes a drop and a recovery visible
            on small data).
        new_pattern_from: where in the span the new pattern starts (a fraction of
            ``n_days``, default 0.7: from day ``ceil(0.7 * n_days)``).

    Returns:
        A frame sorted by timestamp (index 0..n-1) with the canonical columns
        transaction_id (int64, unique, increasing with time), account_id (int64),
        timestamp (datetime64[ns]), amount (float64, 2 decimals), label (int8),
        terminal_id (int64), category (str), channel (str: pos/online/atm), age
        (int64), occupation (str), account_age_days (int64, at the start date) and
        scenario (str, "" for legit rows).

    Raises:
        ValueError: a size is not positive or ``fraud_rate`` is outside (0, 0.5).
    """
    if n_accounts < 1 or n_terminals < 3 or n_days < 1:
        raise ValueError(
            f"need n_accounts >= 1, n_terminals >= 3 and n_days >= 1; got "
            f"{n_accounts}, {n_terminals}, {n_days}"
        )
    if not 0.0 < fraud_rate < 0.5:
        raise ValueError(f"fraud_rate must be in (0, 0.5); got {fraud_rate}")
    rng = np.random.default_rng(seed)
    start_ts = pd.Timestamp(start).normalize()
    start_dow = start_ts.dayofweek

    term = make_terminals(rng, n_terminals)
    acc = make_accounts(rng, n_accounts, n_days, term)
    legit = legit_transactions(rng, acc, term, n_days, start_dow)
    label = np.zeros(len(legit), dtype=np.int8)

    target = fraud_rate * len(legit) / (1.0 - fraud_rate)

    def events(share: float, mean_size: float) -> int:
        return max(1, round(share * target / mean_size))

    parts = [
        legit,
        card_testing(rng, acc, term, events(SHARE[CARD], 4.5), n_days),
        account_takeover(rng, acc, term, events(SHARE[ATO], 8.0), n_days),
        velocity(rng, acc, term, events(SHARE[VELO], 10.5), n_days),
        stealth(rng, acc, term, events(SHARE[STEALTH], 1.0), n_days),
    ]
    compromise_terminals(rng, legit, label, term, max(1, round(SHARE[TERM] * target)), n_days)
    if new_pattern:
        if not 0.0 < new_pattern_rate < 0.5 or not 0.0 <= new_pattern_from < 1.0:
            raise ValueError(f"new_pattern_rate must be in (0, 0.5) and new_pattern_from in [0, 1); got "
                             f"{new_pattern_rate}, {new_pattern_from}")
        day_lo = int(np.ceil(new_pattern_from * n_days))
        n_recent = (legit.t >= day_lo * DAY).sum()
        n_new = max(1, round(new_pattern_rate * n_recent / 7.0))
        parts.append(new_pattern_fraud(rng, acc, term, n_new, day_lo, n_days))
    labels = [label] + [np.ones(len(p), dtype=np.int8) for p in parts[1:]]
    tx = concat(parts)
    label = np.concatenate(labels)

    keep = (tx.t >= 0) & (tx.t < n_days * DAY)
    order = np.flatnonzero(keep)[np.argsort(tx.t[keep], kind="stable")]
    terminal = tx.terminal[order]
    a = tx.account[order]
    timestamps = start_ts.as_unit("ns") + pd.to_timedelta(tx.t[order], unit="s")
    frame = pd.DataFrame(
        {
            TRANSACTION_ID: np.arange(len(order), dtype=np.int64),
            ACCOUNT_ID: a,
            TIMESTAMP: timestamps,
            AMOUNT: np.round(np.maximum(tx.amount[order], 0.01), 2),
            LABEL: label[order],
            TERMINAL_ID: terminal,
            CATEGORY: np.asarray(CATEGORIES, dtype=object)[term.category[terminal]],
            CHANNEL: np.asarray(CHANNELS, dtype=object)[term.channel[terminal]],
            AGE: acc.age[a],
            OCCUPATION: np.asarray(OCCUPATIONS, dtype=object)[acc.occupation[a]],
            ACCOUNT_AGE_DAYS: acc.account_age_days[a],
            SCENARIO: np.asarray(SCENARIOS, dtype=object)[tx.scenario[order]],
        }
    )
    frame[TIMESTAMP] = frame[TIMESTAMP].astype("datetime64[ns]")
    for col in (CATEGORY, CHANNEL, OCCUPATION, SCENARIO):
        frame[col] = frame[col].astype(str)
    return frame
