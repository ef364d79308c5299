"""Federated fraud training's domain logic: partitions, shared moments, local DP-SGD and its accounting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.store import sha256_file
from infra.tables import time_split
from solutions.fraud import federated as FD
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import (
    DP_BATCH_SIZE,
    DP_LEARNING_RATE,
    DP_LOCAL_EPOCHS,
    SMALL_MODEL,
    FederationConfig,
    SequenceModelConfig,
)
from solutions.fraud.synthetic import generate_transactions

CFG = SequenceModelConfig(hidden=8, mlp_hidden=16, seq_len=4, batch_size=128, negative_rate=0.5)


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return generate_transactions(n_accounts=240, n_terminals=100, n_days=30, fraud_rate=0.03, seed=1)


@pytest.fixture(scope="module")
def banks(table: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> list[FD.BankData]:
    parts = FD.write_partitions(table, FD.partition_banks(table, 2), tmp_path_factory.mktemp("banks"))
    bounds = time_split(table[S.TIMESTAMP], train_days=12, val_days=3, delay_days=3, test_days=5)
    return [FD.load_bank(p, bounds, 3) for p in parts]


def test_partitions_are_disjoint_stable_and_complete(table: pd.DataFrame, tmp_path: Path) -> None:
    a, b = FD.partition_banks(table, 3), FD.partition_banks(table.sample(frac=1, random_state=0).sort_index(), 3)
    assert (a == b).all() and set(a) == {0, 1, 2}
    assert table.groupby(S.ACCOUNT_ID)[S.ACCOUNT_ID].transform(lambda s: 0).shape[0] == len(a)
    assert pd.Series(a).groupby(table[S.ACCOUNT_ID].to_numpy()).nunique().max() == 1  # one bank per account
    parts = FD.write_partitions(table, a, tmp_path)
    assert sum(p.rows for p in parts) == len(table)
    FD.check_disjoint(parts)
    by_channel = FD.partition_banks(table, 2, by=S.CHANNEL)
    assert pd.Series(by_channel).groupby(table[S.CHANNEL].to_numpy()).nunique().max() == 1
    with pytest.raises(ValueError, match="no column"):
        FD.partition_banks(table, 2, by="nope")


def test_a_client_reads_only_its_own_partition(table: pd.DataFrame, tmp_path: Path) -> None:
    parts = FD.write_partitions(table, FD.partition_banks(table, 2), tmp_path)
    bounds = time_split(table[S.TIMESTAMP], train_days=12, val_days=3, delay_days=3, test_days=5)
    other = parts[0].model_copy(update={"path": parts[1].path})  # bank 0 pointed at bank 1's file
    with pytest.raises(AssertionError, match="not the partition written for this bank"):
        FD.load_bank(other, bounds, 3)
    bank = FD.load_bank(parts[0], bounds, 3)
    ids = set(pd.read_parquet(parts[1].path)[S.ACCOUNT_ID])
    assert not ids & set(bank.table[S.ACCOUNT_ID])


def test_invalid_bank_data_is_refused_with_a_named_error(table: pd.DataFrame, tmp_path: Path) -> None:
    bad = table.head(500).copy()
    bad[S.AMOUNT] = bad[S.AMOUNT].astype("object")
    bad.loc[3, S.AMOUNT] = "lots"
    path = tmp_path / "bank-0.parquet"
    bad.astype({S.AMOUNT: "string"}).to_parquet(path, index=False)
    part = FD.BankPartition(bank=0, path=str(path), sha256=sha256_file(path), rows=len(bad), accounts=1)
    bounds = time_split(table[S.TIMESTAMP], train_days=12, val_days=3, delay_days=3, test_days=5)
    with pytest.raises(FD.BankRefused, match=r"bank 0 refused: .*amount"):
        FD.load_bank(part, bounds, 3)


def test_merged_moments_equal_the_pooled_preprocessor(banks: list[FD.BankData]) -> None:
    pre, pos, neg = FD.merge_moments([FD.local_moments(b, CFG) for b in banks])
    pooled_table = pd.concat([b.table for b in banks], ignore_index=True)
    pooled_feats = pd.concat([b.features for b in banks], ignore_index=True)
    names = P.context_feature_names(pooled_feats)
    pooled = P.FraudPreprocessor(names).fit(pooled_table, pooled_feats[P.PERIOD].to_numpy() == "train", pooled_feats)
    for key in ("step_mean_", "step_std_", "static_mean_", "window_mean_", "window_std_"):
        np.testing.assert_allclose(getattr(pre, key), getattr(pooled, key), rtol=1e-6, atol=1e-9)
    assert pre.vocab_ == pooled.vocab_
    train = pooled_feats[P.PERIOD] == "train"
    assert pos == pooled_table.loc[train.to_numpy(), S.LABEL].sum() and pos + neg == train.sum()


def test_dp_sgd_trains_and_reports_the_accountants_epsilon(banks: list[FD.BankData]) -> None:
    pre, pos, neg = FD.merge_moments([FD.local_moments(b, CFG) for b in banks])
    model = FD.initial_model(pre, CFG, FD.federated_pos_weight(pos, neg, 1.0))
    bank = FD.bank_setup(banks[0], pre, CFG)
    settings = FD.DPSettings(epsilon=4.0, delta=1e-5, max_grad_norm=1.0, rounds=2, local_epochs=1)
    privacy = FD.privacy_for(settings, bank.n_train(), CFG.batch_size)
    before = [w.copy() for w in FD.get_weights(model)]
    eps = []
    for rnd in range(2):
        fit = FD.train_local(model, bank, CFG, 1, seed=rnd, privacy=privacy)
        eps.append(fit.epsilon)
    after = FD.get_weights(model)
    assert any(not np.allclose(a, b) for a, b in zip(before, after, strict=True))  # the plain GRU got the update
    steps = privacy.steps()
    assert steps >= 2 * privacy.steps_per_epoch - 2  # Poisson batches: an empty one is skipped
    assert eps[0] < eps[1] <= 4.0 + 0.05
    assert eps[1] == pytest.approx(FD.accountant_epsilon(privacy.noise_multiplier, privacy.sample_rate, steps, 1e-5))
    y, s = FD.bank_scores(model, bank, "test")
    assert len(y) == len(s) == (banks[0].periods() == "test").sum() and np.isfinite(s).all()


def test_weights_round_trip(banks: list[FD.BankData]) -> None:
    pre, _, _ = FD.merge_moments([FD.local_moments(b, CFG) for b in banks])
    a = FD.initial_model(pre, CFG, 1.0)
    b = FD.initial_model(pre, CFG.model_copy(update={"seed": 5}), 1.0)
    FD.set_weights(b, FD.get_weights(a))
    assert all(np.array_equal(x, y) for x, y in zip(FD.get_weights(a), FD.get_weights(b), strict=True))


@pytest.mark.parametrize(("lr", "momentum"), [(1.0, 0.0), (2.0, 0.0), (1.0, 0.5)])
def test_the_server_step_is_fedavg_or_fedavgm(banks: list[FD.BankData], tmp_path: Path, lr: float,
                                              momentum: float) -> None:
    """Round 1 agrees on the preprocessor; each training round moves the global weights by
    ``lr`` x the row-weighted mean update (plus momentum): plain FedAvg at lr 1, momentum 0."""
    from types import SimpleNamespace

    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    from solutions.fraud.flower_apps import ServerSpec, strategy_for

    spec = ServerSpec(address="127.0.0.1:1", clients=2, min_clients=2, rounds=2, round_timeout_s=60,
                      connect_timeout_s=1, model=CFG, dp=False, run_dir=str(tmp_path),
                      server_learning_rate=lr, server_momentum=momentum)
    strategy = strategy_for(spec)
    ok = Status(code=Code.OK, message="")

    def res(arrays: list[np.ndarray], n: int, metrics: dict) -> tuple[object, FitRes]:
        return SimpleNamespace(cid="c"), FitRes(ok, ndarrays_to_parameters(arrays), n, metrics)

    moments = [res([], 0, {"moments": json.dumps(FD.local_moments(b, CFG)), "sha256": b.sha256,
                            "rows": json.dumps(b.rows()), "bank": b.bank}) for b in banks]
    start, _ = strategy.aggregate_fit(1, moments, [])
    w0 = parameters_to_ndarrays(start)
    velocity = [np.zeros_like(w) for w in w0]
    current = w0
    for rnd, (n_a, n_b) in enumerate([(100, 300), (200, 200)], start=2):
        rng = np.random.default_rng(rnd)
        da = [rng.normal(size=w.shape).astype(w.dtype) for w in current]
        db = [rng.normal(size=w.shape).astype(w.dtype) for w in current]
        results = [res([w + d for w, d in zip(current, da, strict=True)], n_a, {"bank": 0, "loss": 1.0}),
                   res([w + d for w, d in zip(current, db, strict=True)], n_b, {"bank": 1, "loss": 1.0})]
        out, _ = strategy.aggregate_fit(rnd, results, [])
        mean = [(n_a * a + n_b * b) / (n_a + n_b) for a, b in zip(da, db, strict=True)]
        velocity = [momentum * v + m for v, m in zip(velocity, mean, strict=True)] if momentum else mean
        expected = [w + lr * v for w, v in zip(current, velocity, strict=True)]
        got = parameters_to_ndarrays(out)
        assert all(np.allclose(g, e, atol=1e-5) for g, e in zip(got, expected, strict=True))
        current = got


def test_a_bank_can_resume_its_adamw_moments_between_rounds(banks: list[FD.BankData]) -> None:
    pre, pos, neg = FD.merge_moments([FD.local_moments(b, CFG) for b in banks])
    bank = FD.bank_setup(banks[0], pre, CFG)
    model = FD.initial_model(pre, CFG, FD.federated_pos_weight(pos, neg, CFG.negative_rate))
    first = FD.train_local(model, bank, CFG, 1, seed=1)
    second = FD.train_local(model, bank, CFG, 1, seed=2, optimizer_state=first.optimizer_state)
    fresh = FD.train_local(model, bank, CFG, 1, seed=2)

    def steps(fit: FD.LocalFit) -> float:
        assert fit.optimizer_state is not None
        return float(next(iter(fit.optimizer_state["state"].values()))["step"])

    assert steps(first) == first.steps and steps(fresh) == fresh.steps
    assert steps(second) == first.steps + second.steps  # the moments went on, not restarted


def test_dp_training_resumes_its_adamw_moments_without_spending_more(banks: list[FD.BankData]) -> None:
    pre, pos, neg = FD.merge_moments([FD.local_moments(b, CFG) for b in banks])
    bank = FD.bank_setup(banks[0], pre, CFG)
    settings = FD.DPSettings(epsilon=4.0, delta=1e-5, max_grad_norm=1.0, rounds=2, local_epochs=1)
    privacy = FD.privacy_for(settings, bank.n_train(), CFG.batch_size)
    model = FD.initial_model(pre, CFG, FD.federated_pos_weight(pos, neg, 1.0))
    first = FD.train_local(model, bank, CFG, 1, seed=1, privacy=privacy)
    second = FD.train_local(model, bank, CFG, 1, seed=2, privacy=privacy, optimizer_state=first.optimizer_state)
    step = float(next(iter(second.optimizer_state["state"].values()))["step"])
    assert step == first.steps + second.steps
    assert second.epsilon is not None and second.epsilon <= 4.0 + 1e-6  # the accountant's budget holds


def test_the_summary_says_what_to_change_for_the_measured_recipe() -> None:
    """Few rounds and unshared terminal counts are named with the flag that changes them; the
    defaults run the measured rounds, and sharing stays the banks' choice (off by default)."""
    defaults = FederationConfig()
    assert defaults.rounds >= 24 and not defaults.share_terminal_stats
    notes = FederationConfig(rounds=3).recipe_notes()
    assert len(notes) == 2 and "--rounds 24" in notes[0] and "--share-terminal-stats" in notes[1]
    assert len(defaults.recipe_notes()) == 1 and "not noised" in defaults.recipe_notes()[0]
    assert FederationConfig(share_terminal_stats=True).recipe_notes() == []


def test_dp_batch_size_and_learning_rate_apply_only_under_dp() -> None:
    base = SMALL_MODEL
    plain = FederationConfig(dp_batch_size=2048, dp_learning_rate=0.01)
    assert plain.client_model(base) == base
    private = FederationConfig(dp_epsilon=8, dp_batch_size=2048, dp_learning_rate=0.01)
    model = private.client_model(base)
    assert (model.batch_size, model.lr) == (2048, 0.01)
    assert model.hidden == base.hidden
    defaults = FederationConfig(dp_epsilon=8)
    assert defaults.client_model(base) == base.model_copy(update={"lr": DP_LEARNING_RATE,
                                                                  "batch_size": DP_BATCH_SIZE})
    assert FederationConfig(dp_epsilon=8, dp_learning_rate=None, dp_batch_size=None).client_model(base) == base
    # the DP epochs per round apply only under DP; None falls back to local_epochs
    assert (FederationConfig(local_epochs=2).epochs_per_round(), defaults.epochs_per_round()) == (2, DP_LOCAL_EPOCHS)
    assert FederationConfig(dp_epsilon=8, local_epochs=2, dp_local_epochs=None).epochs_per_round() == 2
    state = FD.privacy_for(FD.DPSettings(epsilon=8, delta=1e-5, max_grad_norm=1.0, rounds=2, local_epochs=1),
                           n_train=10_000, batch_size=model.batch_size)
    assert state.steps_per_epoch == 5 and state.sample_rate == 0.2


def test_train_best_val_keeps_the_best_validation_epoch(banks: list[FD.BankData]) -> None:
    """Early stopping for the pooled and bank-alone comparisons: the model ends at the epoch whose
    validation AP was highest, and the training's random stream is the one without the checks."""
    pre, pos, neg = FD.merge_moments([FD.local_moments(b, CFG) for b in banks])
    bank = FD.bank_setup(banks[0], pre, CFG)
    weight = FD.federated_pos_weight(pos, neg, CFG.negative_rate)
    seen: dict[int, tuple[float, list[np.ndarray]]] = {}

    def record(model: FD.FraudSequenceModel) -> object:
        def on_epoch(epoch: int) -> None:
            seen[epoch] = (FD.ranking_metrics(*FD.bank_scores(model, bank, "val"))["ap"], FD.get_weights(model))
        return on_epoch

    traced = FD.initial_model(pre, CFG, weight)
    FD.train_local(traced, bank, CFG, 4, seed=3, on_epoch=record(traced))
    plain = FD.initial_model(pre, CFG, weight)
    FD.train_local(plain, bank, CFG, 4, seed=3)
    # the per-epoch check gives torch's random state back: the same training as without it
    assert all(np.array_equal(a, b) for a, b in zip(FD.get_weights(traced), FD.get_weights(plain), strict=True))
    best_epoch = max(seen, key=lambda e: seen[e][0])
    model = FD.initial_model(pre, CFG, weight)
    assert FD.train_best_val(model, bank, CFG, 4, seed=3) == best_epoch
    assert all(np.array_equal(a, b) for a, b in zip(FD.get_weights(model), seen[best_epoch][1], strict=True))


def test_the_best_round_is_judged_on_the_banks_of_the_last_round() -> None:
    from solutions.fraud.flower_apps import best_round

    def train(rnd: int, aps: dict[str, float], rows: int = 10) -> dict:
        return {"round": rnd, "phase": "train", "val_ap": aps, "val_rows": dict.fromkeys(aps, rows)}

    moments = {"round": 0, "phase": "moments"}
    assert best_round([moments]) is None
    # bank 2 crashed for good after round 1: rounds 2-3 are judged on banks 0 and 1 alone
    crashed = [moments, train(1, {"0": 0.5, "1": 0.6, "2": 0.9}), train(2, {"0": 0.7, "1": 0.7}),
               train(3, {"0": 0.6, "1": 0.65})]
    assert best_round(crashed) == 2
    # every bank back in round 3: round 2 (bank 2 missing) cannot be compared with it
    back = [*crashed[:3], train(3, {"0": 0.6, "1": 0.65, "2": 0.1})]
    assert best_round(back) == 1
    # a bank without fraud in its validation days (AP NaN) is left out; rows weigh the banks
    nan = [moments, train(1, {"0": 0.8, "1": float("nan")}), train(2, {"0": 0.9, "1": float("nan")})]
    assert best_round(nan) == 2
    weighted = [moments, {"round": 1, "phase": "train", "val_ap": {"0": 0.9, "1": 0.1}, "val_rows": {"0": 1, "1": 9}},
                {"round": 2, "phase": "train", "val_ap": {"0": 0.2, "1": 0.3}, "val_rows": {"0": 1, "1": 9}}]
    assert best_round(weighted) == 2


def test_shared_features_count_every_banks_transactions_at_a_terminal(banks: list[FD.BankData],
                                                                     table: pd.DataFrame) -> None:
    bounds = time_split(table[S.TIMESTAMP], train_days=12, val_days=3, delay_days=3, test_days=5)
    shared = FD.shared_bank(banks, bounds, 3)
    assert len(shared.table) == sum(len(b.table) for b in banks) and shared.table[S.TIMESTAMP].is_monotonic_increasing
    # the data-sharing features are the features of the whole table, not the banks' own ones glued together
    whole = table.sort_values([S.TIMESTAMP, S.TRANSACTION_ID]).reset_index(drop=True)
    whole_features = P.build_features(whole, shared.periods(), 3)
    pd.testing.assert_frame_equal(shared.features, whole_features)
    own = pd.concat([b.features.assign(_id=b.table[S.TRANSACTION_ID].to_numpy()) for b in banks]).set_index("_id")
    joined = shared.features.assign(_id=shared.table[S.TRANSACTION_ID].to_numpy()).set_index("_id").loc[own.index]
    # a terminal's 7-day transaction count sees both banks' rows: never fewer, more wherever both banks were there
    assert (joined["term_nb_tx_7d"] >= own["term_nb_tx_7d"] - 1e-9).all()
    assert (joined["term_nb_tx_7d"] > own["term_nb_tx_7d"] + 1e-9).mean() > 0.5
    # the account features are the same: an account's rows are all in one bank
    np.testing.assert_allclose(joined["cust_nb_tx_7d"], own["cust_nb_tx_7d"])


def test_terminal_counts_summed_across_banks_give_every_banks_transactions(banks: list[FD.BankData],
                                                                          table: pd.DataFrame) -> None:
    counts = [FD.terminal_day_counts(b) for b in banks]
    assert set(counts[0]) == {"terminal", "day", "n", "known", "fraud"}  # no account, amount or time of day
    totals = FD.merge_terminal_counts(counts)
    assert sum(totals["n"]) == len(table) and sum(totals["fraud"]) == int(table[S.LABEL].sum())
    bounds = time_split(table[S.TIMESTAMP], train_days=12, val_days=3, delay_days=3, test_days=5)
    exact = FD.shared_bank(banks, bounds, 3)
    exact_by_id = exact.features.assign(_id=exact.table[S.TRANSACTION_ID].to_numpy()).set_index("_id")
    for bank in banks:
        shared = FD.with_shared_terminals(bank, totals, 3)
        assert shared.table is bank.table and list(shared.features.columns) == list(bank.features.columns)
        other = [c for c in bank.features.columns if not c.startswith("term_")]
        pd.testing.assert_frame_equal(shared.features[other], bank.features[other])  # only terminal columns change
        ref = exact_by_id.loc[bank.table[S.TRANSACTION_ID].to_numpy()]
        for w in (7, 30):  # whole days before the day of t - delay: close to the exact shared windows
            col = f"term_nb_tx_{w}d"
            assert np.corrcoef(shared.features[col], ref[col])[0, 1] > 0.98
            assert np.corrcoef(bank.features[col], ref[col])[0, 1] < np.corrcoef(shared.features[col], ref[col])[0, 1]
            assert shared.features[col].mean() > 1.5 * bank.features[col].mean()  # the other bank's rows count
        risk = shared.features["term_risk_7d"]
        assert ((risk >= 0) & (risk <= 1)).all()
    # a bank never sees a label from after t - delay: a row's windows end before the day of t - delay
    one = FD.with_shared_terminals(banks[0], FD.merge_terminal_counts([counts[0]]), 3)
    early = banks[0].table[S.TIMESTAMP] < banks[0].table[S.TIMESTAMP].min() + pd.Timedelta(days=3)
    assert early.any() and (one.features.loc[early.to_numpy(), ["term_nb_tx_1d", "term_nb_tx_30d"]] == 0).all().all()
