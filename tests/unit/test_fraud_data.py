"""Unit tests of the fraud data pieces: schema, synthetic generator, window features."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from solutions.fraud import schema
from solutions.fraud.features import WindowFeatureBaseline, WindowFeatures
from solutions.fraud.schema import ColumnMapping
from solutions.fraud.synthetic import generate_transactions

OLD_SCENARIOS = {"card_testing", "account_takeover", "compromised_terminal", "velocity_burst"}


@pytest.fixture(scope="module")
def small() -> pd.DataFrame:
    return generate_transactions(n_accounts=600, n_terminals=200, n_days=40, seed=0)


@pytest.fixture(scope="module")
def tiny() -> pd.DataFrame:
    return generate_transactions(n_accounts=80, n_terminals=40, n_days=20, seed=5)


# -- schema -------------------------------------------------------------------------


def test_column_mapping_parse_and_apply() -> None:
    m = ColumnMapping.parse(" account_id=CUSTOMER_ID , timestamp=TX_DATETIME,amount=TX_AMOUNT")
    assert dict(m.columns) == {
        "account_id": "CUSTOMER_ID",
        "timestamp": "TX_DATETIME",
        "amount": "TX_AMOUNT",
    }
    src = pd.DataFrame({"CUSTOMER_ID": [1], "TX_DATETIME": ["2025-01-01"], "TX_AMOUNT": [3.0], "x": [0]})
    out = m.apply(src)
    assert list(out.columns) == ["account_id", "timestamp", "amount", "x"]
    assert ColumnMapping.parse("").apply(src).equals(src)
    assert hash(m) == hash(
        ColumnMapping.parse("timestamp=TX_DATETIME,amount=TX_AMOUNT,account_id=CUSTOMER_ID")
    )


@pytest.mark.parametrize(
    "spec, bad", [("account_id=A,nonsense=B", "nonsense=B"), ("account_id", "account_id")]
)
def test_column_mapping_parse_errors(spec: str, bad: str) -> None:
    with pytest.raises(ValueError) as err:
        ColumnMapping.parse(spec)
    assert bad in str(err.value)
    assert "transaction_id" in str(err.value) and "account_age_days" in str(err.value)


def test_column_mapping_missing_source_column() -> None:
    df = pd.DataFrame({"A": [1], "B": [2]})
    with pytest.raises(ValueError, match="CUSTOMER_ID") as err:
        ColumnMapping.parse("account_id=CUSTOMER_ID").apply(df)
    assert "'A'" in str(err.value) and "'B'" in str(err.value)


# -- generator ----------------------------------------------------------------------


def test_generator_is_deterministic(tiny: pd.DataFrame) -> None:
    again = generate_transactions(n_accounts=80, n_terminals=40, n_days=20, seed=5)
    pd.testing.assert_frame_equal(tiny, again)
    other = generate_transactions(n_accounts=80, n_terminals=40, n_days=20, seed=6)
    assert not tiny[schema.AMOUNT].equals(other[schema.AMOUNT])


def test_generator_schema(tiny: pd.DataFrame) -> None:
    for col in (*schema.REQUIRED, *schema.OPTIONAL, schema.SCENARIO):
        assert col in tiny.columns
    assert tiny[schema.TRANSACTION_ID].is_unique
    assert pd.api.types.is_datetime64_any_dtype(tiny[schema.TIMESTAMP])
    assert tiny[schema.TIMESTAMP].is_monotonic_increasing
    assert set(tiny[schema.CHANNEL]) <= {"pos", "online", "atm"}
    assert tiny[schema.AGE].between(18, 90).all()
    # Static attributes are constant per account; labels agree with scenarios.
    assert (tiny.groupby(schema.ACCOUNT_ID)[[schema.AGE, schema.OCCUPATION]].nunique() == 1).all().all()
    assert ((tiny[schema.LABEL] == 1) == (tiny[schema.SCENARIO] != "")).all()


def test_fraud_rate_and_scenarios(small: pd.DataFrame) -> None:
    assert 0.005 <= small[schema.LABEL].mean() <= 0.02
    assert set(small[schema.SCENARIO]) >= OLD_SCENARIOS
    assert "new_pattern" not in set(small[schema.SCENARIO])


def test_new_pattern_only_in_last_30_percent(small: pd.DataFrame) -> None:
    df = generate_transactions(n_accounts=600, n_terminals=200, n_days=40, seed=0, new_pattern=True)
    new = df[df[schema.SCENARIO] == "new_pattern"]
    assert len(new) > 0
    start = pd.Timestamp("2025-01-01")
    assert (new[schema.TIMESTAMP] >= start + pd.Timedelta(days=0.7 * 40)).all()
    assert 0.005 <= df[schema.LABEL].mean() <= 0.02
    # The rest of the data is the same as without the new pattern.
    rest = df[df[schema.SCENARIO] != "new_pattern"].drop(columns=schema.TRANSACTION_ID)
    pd.testing.assert_frame_equal(
        rest.reset_index(drop=True), small.drop(columns=schema.TRANSACTION_ID).reset_index(drop=True)
    )


# -- window features ----------------------------------------------------------------


def test_customer_windows_match_pandas_rolling(tiny: pd.DataFrame) -> None:
    feats = WindowFeatures().fit(tiny).transform(tiny)
    assert feats.index.equals(tiny.index)
    assert np.isfinite(feats.to_numpy()).all()
    ref = tiny.set_index(schema.TIMESTAMP).groupby(schema.ACCOUNT_ID)[schema.AMOUNT]
    for w in (1, 7, 30):
        roll = ref.rolling(f"{w}D")
        count = roll.count().reset_index(level=0, drop=True)
        mean = roll.mean().reset_index(level=0, drop=True)
        # Align the reference (ordered by account, then time) back to the rows.
        order = tiny.sort_values([schema.ACCOUNT_ID, schema.TIMESTAMP], kind="stable").index
        np.testing.assert_allclose(feats.loc[order, f"cust_nb_tx_{w}d"], count.to_numpy())
        np.testing.assert_allclose(feats.loc[order, f"cust_mean_amount_{w}d"], mean.to_numpy(), rtol=1e-9)


def test_terminal_windows_brute_force(tiny: pd.DataFrame) -> None:
    feats = WindowFeatures(delay_days=3).fit(tiny).transform(tiny)
    rng = np.random.default_rng(0)
    ts, term, lab = tiny[schema.TIMESTAMP], tiny[schema.TERMINAL_ID], tiny[schema.LABEL]
    for i in rng.choice(len(tiny), size=40, replace=False):
        t, k = ts.iloc[i], term.iloc[i]
        for w in (1, 7):
            m = (term == k) & (ts >= t - pd.Timedelta(days=3 + w)) & (ts < t - pd.Timedelta(days=3))
            assert feats[f"term_nb_tx_{w}d"].iloc[i] == m.sum()
            risk = lab[m].mean() if m.any() else 0.0
            assert feats[f"term_risk_{w}d"].iloc[i] == pytest.approx(risk)


def test_no_future_leakage(tiny: pd.DataFrame) -> None:
    wf = WindowFeatures(delay_days=0).fit(tiny)
    base = wf.transform(tiny)
    cut = tiny[schema.TIMESTAMP].iloc[len(tiny) // 2]
    later = tiny[schema.TIMESTAMP] >= cut
    changed = tiny.copy()
    changed.loc[later, schema.AMOUNT] = changed.loc[later, schema.AMOUNT] * 10 + 1
    changed.loc[later, schema.LABEL] = 1 - changed.loc[later, schema.LABEL]
    after = wf.transform(changed)
    pd.testing.assert_frame_equal(base[~later], after[~later])
    # Dropping the future does not change the past either.
    pd.testing.assert_frame_equal(base[~later], wf.transform(tiny[~later]))
    # A row's own label never enters its features.
    flipped = tiny.copy()
    flipped[schema.LABEL] = 1 - flipped[schema.LABEL]
    own = wf.transform(flipped)
    risk = [c for c in base.columns if c.startswith("term_risk")]
    pd.testing.assert_frame_equal(base.drop(columns=risk), own.drop(columns=risk))


def test_unseen_entities_and_optional_columns(tiny: pd.DataFrame) -> None:
    wf = WindowFeatures().fit(tiny)
    new = tiny.tail(30).copy()
    new[schema.ACCOUNT_ID] = new[schema.ACCOUNT_ID] + 10**6
    new[schema.TERMINAL_ID] = -1
    new[schema.CATEGORY] = "never_seen"
    new = new.drop(columns=[schema.LABEL])
    out = wf.transform(pd.concat([tiny, new]).reset_index(drop=True))
    assert np.isfinite(out.to_numpy()).all()
    assert (out.filter(like="category=").tail(30) == 0).all().all()
    bare = tiny[[schema.ACCOUNT_ID, schema.TIMESTAMP, schema.AMOUNT, schema.LABEL]]
    slim = WindowFeatures().fit(bare)
    assert not any(n.startswith("term_") for n in slim.feature_names_out_)
    assert slim.transform(bare).shape == (len(bare), len(slim.feature_names_out_))


def test_baseline_learns_but_is_not_trivial(small: pd.DataFrame) -> None:
    X = WindowFeatures().fit(small).transform(small)
    day = (small[schema.TIMESTAMP] - small[schema.TIMESTAMP].min().normalize()).dt.days
    train = ((day >= 12) & (day < 26)).to_numpy()
    test = (day >= 33).to_numpy()
    y = small[schema.LABEL].to_numpy()
    model = WindowFeatureBaseline(max_iter=150, random_state=0, n_threads=1).fit(X[train], y[train])
    p = model.predict_proba(X[test])[:, 1]
    assert roc_auc_score(y[test], p) > 0.7
    assert average_precision_score(y[test], p) < 0.98


def test_row_order_does_not_matter(tiny: pd.DataFrame) -> None:
    wf = WindowFeatures().fit(tiny)
    shuffled = tiny.sample(frac=1.0, random_state=0)
    pd.testing.assert_frame_equal(wf.transform(tiny), wf.transform(shuffled).loc[tiny.index])


def test_negative_subsampler_keeps_all_frauds_and_redraws_legit() -> None:
    import numpy as np

    from solutions.fraud.model import NegativeSubsampler

    labels = np.array([1.0] * 10 + [0.0] * 990)
    sampler = NegativeSubsampler(labels, rate=0.2, seed=0)
    first, second = list(sampler), list(sampler)
    assert len(first) == len(sampler) == 10 + 198
    assert set(range(10)) <= set(first) and set(range(10)) <= set(second)
    assert set(first) != set(second), "each epoch draws a new subset of legit rows"
    assert len(set(first)) == len(first)


# -- scoring helpers (plain, no Prefect) ---------------------------------------------


def test_period_checks_labels_and_pattern_rows() -> None:
    from infra.errors import DataValidationError
    from solutions.fraud import scoring

    data = pd.DataFrame({"label": [0, 1, 0, 0, 1, 0], "scenario": ["", "card_testing", "", "", "new_pattern", ""]})
    feats = pd.DataFrame({"period": ["train", "train", "val", "test", "test", "test"]})
    assert scoring.period_counts(feats["period"]) == {"train": 2, "test": 3, "val": 1}
    assert scoring.period_labels(data, feats, "test").tolist() == [0, 1, 0]
    assert scoring.pattern_rows(data, feats, "test", "new_pattern").tolist() == [True, True, True]
    assert scoring.pattern_rows(data, feats, "train", "new_pattern") is None  # no such fraud there
    with pytest.raises(DataValidationError, match="the val period .* has 1 rows and 0 frauds"):
        scoring.check_both_classes(data, feats, "split text", "src.csv")
    scoring.check_both_classes(data, feats, "split text", "src.csv", periods=("train", "test"))
    assert scoring.winner(0.5, None) == "sequence" and scoring.winner(0.5, 0.6) == "baseline"
