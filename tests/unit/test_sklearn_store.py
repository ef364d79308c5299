"""scikit-learn models stored with skops: identical predictions, and only allow-listed types load."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

from infra.errors import RegistryError
from infra.sklearn_store import load_estimator, save_estimator


def test_gbm_round_trip_predicts_the_same(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5))
    x[::9, 2] = np.nan  # missing values take the trees' learnt branch after the round trip too
    y = (x[:, 0] + rng.normal(scale=0.5, size=400) > 0).astype(int)
    model = HistGradientBoostingClassifier(max_iter=20, random_state=0).fit(x, y)
    loaded = load_estimator(save_estimator(model, tmp_path / "m.skops"))
    np.testing.assert_array_equal(loaded.predict_proba(x), model.predict_proba(x))


def test_a_file_naming_an_unknown_type_is_refused(tmp_path: Path) -> None:
    evil = make_pipeline(FunctionTransformer(os.system))  # would run a command if loaded blindly
    path = save_estimator(evil, tmp_path / "evil.skops")
    with pytest.raises(RegistryError, match="outside the allow-list"):
        load_estimator(path)
    with pytest.raises(RegistryError, match="missing"):
        load_estimator(tmp_path / "absent.skops")
