"""Engine-split cross-validation helpers: folds by asset, normaliser without the held-out
assets, scores and the summary table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infra.errors import DataValidationError
from solutions.sensor import crossval as CV
from solutions.sensor import schema as S
from solutions.sensor.config import SensorConfig, WindowConfig


def _grid(n_assets: int = 12, seed: int = 0) -> pd.DataFrame:
    """Run-to-failure assets with two wear sensors; the last two assets' readings are far off
    (so a normaliser that saw them would show it)."""
    rng = np.random.default_rng(seed)
    parts = []
    for i in range(n_assets):
        life = int(rng.integers(40, 60))
        step = np.arange(life)
        shift = 1000.0 if i >= n_assets - 2 else 0.0
        parts.append(pd.DataFrame({
            S.ASSET: f"train-{i + 1}", S.STEP: step,
            "s1": 10 + step / life + rng.normal(0, 0.05, life) + shift, "s2": 5 - step / life + rng.normal(0, 0.05, life),
            S.RUL: (life - 1 - step).astype(float), S.FAILED: True, S.FAILURE_TYPE: "wear", S.SET: "train",
        }))
    return pd.concat(parts, ignore_index=True)


def test_folds_hold_out_every_asset_once() -> None:
    assets = [f"e{i}" for i in range(23)]
    folds = CV.engine_folds(assets, 5, seed=1)
    flat = [a for f in folds for a in f]
    assert sorted(flat) == sorted(assets) and len(flat) == len(set(flat))
    assert sorted(len(f) for f in folds) == [4, 4, 5, 5, 5]
    assert folds == CV.engine_folds(reversed(assets), 5, seed=1) and folds != CV.engine_folds(assets, 5, seed=2)
    with pytest.raises(DataValidationError, match="too few for 5 folds"):
        CV.engine_folds(assets[:10], 5)
    splits = CV.fold_splits(assets, folds[0], val_fraction=0.2, seed=0)
    assert splits["test"] == sorted(folds[0])
    assert not set(splits["train"]) & set(splits["val"]) and not (set(splits["train"]) | set(splits["val"])) & set(folds[0])
    assert len(splits["val"]) == round(0.2 * (23 - len(folds[0])))


def test_cross_fit_splits_validate_on_disjoint_blocks() -> None:
    assets = [f"e{i}" for i in range(30)]
    held_out = assets[:6]
    splits = CV.cross_fit_splits(assets, held_out, val_fraction=0.2, k=3, seed=4)
    rest = set(assets) - set(held_out)
    vals = [set(s["val"]) for s in splits]
    assert [len(v) for v in vals] == [5, 5, 5]  # round(0.2 * 24)
    assert not vals[0] & vals[1] and not vals[0] & vals[2] and not vals[1] & vals[2]
    for s, v in zip(splits, vals, strict=True):
        assert s["test"] == sorted(held_out) and set(s["train"]) == rest - v
    assert splits[0] == CV.fold_splits(assets, held_out, val_fraction=0.2, seed=4)  # the one-split protocol's
    with pytest.raises(DataValidationError, match="disjoint validation blocks"):
        CV.cross_fit_splits(assets, held_out, val_fraction=0.2, k=5, seed=4)  # 25 > 24 assets


def test_fold_normaliser_never_sees_the_held_out_assets() -> None:
    grid = _grid()
    held_out = ["train-11", "train-12"]  # the shifted ones
    splits = CV.fold_splits(CV.training_assets(grid), held_out, val_fraction=0.2)
    wcfg = WindowConfig(length=10, stride=1, n_regimes=1, test_cuts=3)
    fd = CV.fold_data(grid, splits, SensorConfig(), wcfg)
    seen = grid[grid[S.ASSET].isin(splits["train"] + splits["val"])]
    assert fd.normalizer.mean_[0] == pytest.approx(seen[["s1", "s2"]].mean().to_numpy())
    assert set(fd.data.train.asset) == set(splits["train"]) and set(fd.data.test_all.asset) == set(held_out)
    assert len(fd.data.test_last) == 2 * 3  # three random cuts of each held-out asset, last window each
    labelled = CV.fold_data(grid, splits, SensorConfig(), wcfg, labelled=splits["train"][:2]).data
    assert set(labelled.train.asset) == set(splits["train"][:2])
    test_set = grid.assign(**{S.SET: np.where(grid[S.ASSET] == "train-1", "test", "train")})
    assert "train-1" not in CV.training_assets(test_set)


def test_scores_ensemble_and_table() -> None:
    grid = _grid()
    splits = CV.fold_splits(CV.training_assets(grid), ["train-1", "train-2"], val_fraction=0.2)
    data = CV.fold_data(grid, splits, SensorConfig(), WindowConfig(length=10, stride=2, n_regimes=1, test_cuts=2)).data
    truth = data.test_last.rul
    exact = CV.rul_scores(data, truth, data.test_all.rul)
    assert exact["rmse"] == 0 and exact["phm08"] == 0 and exact["rmse_all_windows"] == 0 and exact["units"] == 4
    late = CV.rul_scores(data, truth + 10)
    assert late["rmse"] == pytest.approx(10) and late["phm08"] == pytest.approx(4 * (np.exp(1) - 1))
    assert CV.ensemble(truth + 10, truth - 10) == pytest.approx(truth)
    rows = [{"model": "cnn", "rmse": 12.0, "phm08": 300.0}, {"model": "cnn", "rmse": 14.0, "phm08": 500.0},
            {"model": "gbm", "rmse": 13.0, "phm08": 400.0}]
    summary = CV.summarize(rows)
    cnn = summary.set_index("model").loc["cnn"]
    assert (cnn["rmse_mean"], cnn["rmse_count"]) == (13.0, 2) and cnn["rmse_std"] == pytest.approx(np.sqrt(2))
    table = CV.render_table(summary)
    assert "| cnn | 13.00 ± 1.41 (12.00–14.00) | 400.00 ± 141.42 (300.00–500.00) | 2 |" in table
    assert "| gbm | 13.00 (13.00–13.00) |" in table  # one run: no spread
    assert CV.finite(float("nan")) is None and CV.finite(1.23456) == 1.235


def test_validation_blocks_of_the_flow_split_cross_fit_the_assets() -> None:
    from solutions.sensor import pipeline as P
    from solutions.sensor.config import SplitConfig

    grid = _grid(n_assets=20)
    cfg = SplitConfig(val_fraction=0.15, test_fraction=0.2, seed=3)
    first = P.split_assets(grid, cfg)
    assert P.split_assets(grid, cfg, block=0) == first
    blocks = P.validation_blocks(grid, cfg, 3)
    assert blocks == 3  # 16 non-test assets, blocks of 3
    splits = [P.split_assets(grid, cfg, block=b) for b in range(blocks)]
    vals = [set(s["val"]) for s in splits]
    assert all(len(v) == 3 for v in vals) and len(set().union(*vals)) == 9  # disjoint
    for s, v in zip(splits, vals, strict=True):
        assert s["test"] == first["test"] and set(s["train"]) | v == set(first["train"]) | set(first["val"])
        assert not set(s["train"]) & v
    assert P.validation_blocks(grid, cfg, 10) == 5  # (16 - 1) // 3: each block leaves assets to train on
    with pytest.raises(ValueError, match="past the 16 non-test assets"):
        P.split_assets(grid, cfg, block=6)


def test_a_bag_of_gbms_predicts_their_mean_and_survives_the_registry(tmp_path) -> None:
    from infra.registry import KIND_SKLEARN, ModelRegistry
    from solutions.sensor import candidates as CA
    from solutions.sensor.baseline import WindowGBM

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2, 8)).astype("float32")
    rul = x[:, 0, -1] * 10 + 50
    fail = (rul < 45).astype(int)
    steps = rng.integers(0, 200, size=300)
    parts = [WindowGBM(max_iter=20, random_state=i).fit(x[i::3], rul[i::3], fail[i::3], steps[i::3]) for i in range(3)]
    bag = WindowGBM.bag(parts)
    mean = np.mean([p.predict_rul(x, steps) for p in parts], axis=0)
    assert bag.predict_rul(x, steps) == pytest.approx(mean)
    assert bag.predict_fail_proba(x, steps) == pytest.approx(
        np.mean([p.predict_fail_proba(x, steps) for p in parts], axis=0))
    assert not np.allclose(bag.predict_rul(x, steps), parts[0].predict_rul(x, steps))
    # one GBM alone predicts as before (no bag)
    assert WindowGBM.bag(parts[:1]).predict_rul(x, steps) == pytest.approx(parts[0].predict_rul(x, steps))

    registry = ModelRegistry(tmp_path / "registry")
    files = CA.baseline_files(bag, tmp_path / "files")
    assert sorted(files) == ["fail-1.skops", "fail-2.skops", "fail.skops", "rul-1.skops", "rul-2.skops", "rul.skops"]
    ref = registry.register("bag", {}, kind=KIND_SKLEARN, extra_files=files, params=CA.baseline_params(bag),
                            metrics={"test/rmse": 1.0}, primary_metric="test/rmse", higher_is_better=False)
    loaded = CA.load_baseline(registry.get("bag", ref.version))
    # each member's own degradation features (its health index) come back from the params
    assert loaded.predict_rul(x, steps) == pytest.approx(mean) and len(loaded.bag_) == 2
