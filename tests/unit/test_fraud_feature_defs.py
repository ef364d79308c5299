"""The one definition of the fraud features (solutions.fraud.feature_defs): a file computed as one
chunk equals the same file computed in time-ordered chunks, each with the rows before it as history
(what online scoring does), and the batch path's features are this definition's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from solutions.fraud import feature_defs as FD
from solutions.fraud import schema as S
from solutions.fraud.features import WindowFeatures
from solutions.fraud.sequences import step_features

DAY = FD.NS_PER_DAY


def _rows(n: int = 600, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, 60 * 24, n)).astype(np.int64) * (DAY // 24)  # whole hours: rows on window bounds
    t[5:9] = t[5]  # equal times keep arrival order
    account = rng.integers(0, 9, n).astype(np.int64)
    terminal = rng.integers(-1, 5, n).astype(np.int64)  # -1: no terminal
    amount = rng.gamma(2.0, 30.0, n)
    label = np.where(rng.random(n) < 0.3, np.nan, (rng.random(n) < 0.2).astype(float))
    return t, account, terminal, amount, label


def _summary(account: np.ndarray, t: np.ndarray, amount: np.ndarray, k: int) -> FD.AccountSummary:
    out = FD.AccountSummary.empty(k)
    for a, ti, x in zip(account, t, amount, strict=True):
        out.n[a] += 1
        out.total[a] += x
        out.latest[a] = ti
    return out


@pytest.mark.parametrize("cut", [1, 77, 300])
def test_time_ordered_chunks_with_history_equal_one_chunk(cut: int) -> None:
    t, account, terminal, amount, label = _rows()
    hour, dow = (t // 3_600_000_000_000) % 24 + 0.5, (t // DAY) % 7
    windows = (1, 7, 30)
    whole_acct = FD.account_windows(windows, FD.KeyedRows(account, t, (amount,)))
    whole_term = FD.terminal_windows(windows, 3, FD.KeyedRows(terminal, t, (label,)))
    whole_steps = FD.step_features(FD.KeyedRows(account, t, (amount,)), hour, dow, terminal)
    searched = 0  # chunks whose terminal windows were searched in the history alone (shorter than the delay)
    for start in range(0, len(t), cut):
        h, c = slice(0, start), slice(start, start + cut)
        acct = FD.account_windows(windows, FD.KeyedRows(account[c], t[c], (amount[c],)),
                                  FD.KeyedRows(account[h], t[h], (amount[h],)))
        by_key = np.lexsort((t[h], terminal[h]))  # a terminal's rows after another's, as online state reads them
        past = FD.KeyedRows(terminal[h][by_key], t[h][by_key], (label[h][by_key],))
        term = FD.terminal_windows(windows, 3, FD.KeyedRows(terminal[c], t[c], (label[c],)), past)
        searched += FD._windows_of_history(windows, 3, FD.KeyedRows(terminal[c], t[c], (label[c],)), past) is not None
        pairs = set(zip(account[h].tolist(), terminal[h].tolist(), strict=True))
        known = np.array([(a, x) in pairs for a, x in zip(account[c].tolist(), terminal[c].tolist(), strict=True)])
        steps = FD.step_features(FD.KeyedRows(account[c], t[c], (amount[c],)), hour[c], dow[c], terminal[c],
                                 _summary(account[h], t[h], amount[h], 9), known)
        for name, values in {**acct, **term}.items():
            whole = {**whole_acct, **whole_term}[name][c]
            np.testing.assert_allclose(values, whole, rtol=1e-12, atol=1e-9, err_msg=f"{name} from row {start}")
        np.testing.assert_allclose(steps, whole_steps[c], rtol=1e-12, atol=1e-9, err_msg=f"steps from row {start}")
    assert (searched > 0) == (cut == 1)


def test_a_row_sees_only_rows_before_it() -> None:
    """Two rows of one account at one time: the first counts itself only; the second counts both. A
    terminal row's own label (delay 0) is never inside its own window."""
    t = np.array([0, 0, 2 * DAY], dtype=np.int64)
    key = np.zeros(3, np.int64)
    acct = FD.account_windows((1,), FD.KeyedRows(key, t, (np.array([10.0, 20.0, 5.0]),)))
    assert acct["cust_nb_tx_1d"].tolist() == [1.0, 2.0, 1.0]
    assert acct["cust_mean_amount_1d"].tolist() == [10.0, 15.0, 5.0]
    assert acct["secs_since_prev"].tolist() == [86_400.0, 0.0, 86_400.0]  # none, 0 s, 2 days capped at 1
    term = FD.terminal_windows((7,), 0, FD.KeyedRows(key, t, (np.array([1.0, 0.0, np.nan]),)))
    assert term["term_nb_tx_7d"].tolist() == [0.0, 0.0, 2.0]
    assert term["term_risk_7d"].tolist() == [0.0, 0.0, 0.5]


def test_the_batch_paths_are_the_definition() -> None:
    t, account, terminal, amount, label = _rows(200, seed=1)
    frame = pd.DataFrame({S.ACCOUNT_ID: [f"a{a}" for a in account], S.TIMESTAMP: pd.to_datetime(t),
                          S.AMOUNT: amount, S.TERMINAL_ID: [None if x < 0 else f"x{x}" for x in terminal],
                          S.LABEL: label})
    out = WindowFeatures(delay_days=3).fit(frame).transform(frame)
    codes = pd.factorize(frame[S.TERMINAL_ID].to_numpy(), use_na_sentinel=False)[0]
    term = FD.terminal_windows((1, 7, 30), 3, FD.KeyedRows(codes, t, (label,)))
    for name, values in term.items():
        np.testing.assert_array_equal(out[name].to_numpy(), values, err_msg=name)
    steps = step_features(frame.sort_values([S.ACCOUNT_ID, S.TIMESTAMP], kind="stable"))
    assert list(steps.columns) == list(FD.STEP_NUMERIC)
    assert steps["is_first"].sum() == frame[S.ACCOUNT_ID].nunique()
