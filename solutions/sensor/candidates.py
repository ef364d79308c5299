"""The candidates of a ``sensor-train`` run (CNN, GBM, their mean), chosen on validation;
the GBM stored without pickle.

The CNN early-stops on the validation assets and the GBM is fitted on the training assets
only, so the validation windows are unseen by both weights; the candidate with the lowest
validation RUL RMSE is registered (the ensemble only when it beats both alone) and the test
assets only report. Registered kinds as in ``infra.registry``: ``torch`` (the CNN),
``sklearn-skops`` (the GBM's RUL regressor and failure classifier in skops files) and
``torch+sklearn-skops`` (both, outputs averaged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infra.registry import KIND_SKLEARN, KIND_TORCH, KIND_TORCH_SKLEARN, ModelRef
from infra.sklearn_store import load_estimator, save_estimator
from solutions.sensor.baseline import WindowGBM
from solutions.sensor.degradation import DegradationFeatures
from solutions.sensor.evaluate import rmse

CNN, BASELINE, ENSEMBLE, STACK = "cnn", "baseline", "ensemble", "stack"
KINDS = {CNN: KIND_TORCH, BASELINE: KIND_SKLEARN, ENSEMBLE: KIND_TORCH_SKLEARN, STACK: KIND_TORCH_SKLEARN}
RUL_FILE, FAIL_FILE = "rul.skops", "fail.skops"


@dataclass(frozen=True)
class SensorChoice:
    """The winner on validation and every candidate's validation RUL RMSE."""

    winner: str
    val_rmse: dict[str, float]
    #: validation RUL RMSE of each encoder trunk trained (``SensorConfig.extra_archs``); the best
    #: of them is the ``cnn`` (network) candidate; empty when one trunk was trained
    networks: dict[str, float] = field(default_factory=dict)
    #: validation assets the choice scored on, when cross-fitted (every block's, out of fold); None: one block
    val_assets: int | None = None
    #: the stack's weights of the network's and the GBM's RUL (fitted on every block's out-of-fold
    #: predictions; its validation RMSE is nested: each block by weights fitted on the others); None: no stack
    stack: dict[str, float] | None = None

    @property
    def kind(self) -> str:
        """The registry kind of the winner."""
        return KINDS[self.winner]

    def metrics(self) -> dict[str, float]:
        """``val/<candidate>/rmse`` of every candidate (and ``val/assets`` when cross-fitted)."""
        return {f"val/{k}/rmse": v for k, v in self.val_rmse.items()} | {
            f"val/network-{k}/rmse": v for k, v in self.networks.items()} | (
            {"val/assets": float(self.val_assets)} if self.val_assets is not None else {})


def best_network(val_rmse: dict[str, float]) -> str:
    """The encoder trunk with the lowest validation RUL RMSE (on a tie the one listed first: the
    configured trunk comes first)."""
    best = next(iter(val_rmse))
    for name, value in val_rmse.items():
        if np.isfinite(value) and (not np.isfinite(val_rmse[best]) or value < val_rmse[best]):
            best = name
    return best


def choose_on_validation(rul_val: np.ndarray, cnn_val: np.ndarray, gbm_val: np.ndarray | None,
                         networks: dict[str, float] | None = None, val_assets: int | None = None,
                         block: np.ndarray | None = None) -> SensorChoice:
    """Lowest validation RUL RMSE wins (on a tie the simpler, listed first); ``networks``: the
    trunks' validation RMSE when several were trained (reported; ``cnn_val`` is the best's).
    ``block`` (cross-fitted: each validation row's block) adds the stack, scored nested
    (:func:`solutions.sensor.stack.nested_stack`)."""
    from solutions.sensor.stack import nested_stack

    known = ~np.isnan(rul_val)
    preds = {CNN: cnn_val}
    stack = None
    if gbm_val is not None:
        preds[BASELINE] = gbm_val
        preds[ENSEMBLE] = (cnn_val + gbm_val) / 2
        if block is not None and len(np.unique(block)) > 1 and known.any():
            fitted, preds[STACK] = nested_stack({CNN: cnn_val, BASELINE: gbm_val}, rul_val, block)
            stack = fitted.rounded(4)
    val = {k: rmse(rul_val[known], p[known]) for k, p in preds.items()} if known.any() else {CNN: float("nan")}
    winner = CNN
    for name, value in val.items():
        if np.isfinite(value) and (not np.isfinite(val[winner]) or value < val[winner]):
            winner = name
    return SensorChoice(winner=winner, val_rmse=val, networks=dict(networks or {}), val_assets=val_assets,
                        stack=stack)


def baseline_files(gbm: WindowGBM, folder: Path) -> dict[str, Path]:
    """The GBM's estimators as skops files in ``folder``; ``{file name: path}`` for the registry."""
    files = {RUL_FILE: save_estimator(gbm.regressor_, folder / RUL_FILE)}
    if gbm.classifier_ is not None:
        files[FAIL_FILE] = save_estimator(gbm.classifier_, folder / FAIL_FILE)
    if gbm.learner != "hgb":
        raise ValueError(f"only HistGradientBoosting GBMs are registered (skops files); this one is {gbm.learner}")
    for i, (reg, clf, _, _) in enumerate(getattr(gbm, "bag_", []), start=1):  # a bag's other members
        files[_bag_file(RUL_FILE, i)] = save_estimator(reg, folder / _bag_file(RUL_FILE, i))
        if clf is not None:
            files[_bag_file(FAIL_FILE, i)] = save_estimator(clf, folder / _bag_file(FAIL_FILE, i))
    return files


def _bag_file(name: str, member: int) -> str:
    stem, ext = name.rsplit(".", 1)
    return f"{stem}-{member}.{ext}"


def baseline_params(gbm: WindowGBM) -> dict[str, Any]:
    """JSON parameters of a registered GBM (the constant failure label when one class was seen)."""
    bag = getattr(gbm, "bag_", [])
    features = [None if f is None else f.to_dict() for *_, f in gbm.members()]
    return {"baseline": {"architecture": "WindowGBM", "constant_fail": gbm.constant_, "n_threads": gbm.n_threads,
                         "members": 1 + len(bag), "constant_fail_members": [const for _, _, const, _ in bag],
                         # each member's fitted degradation features (None: the old window summaries)
                         "features": features}}


def load_baseline(ref: ModelRef) -> WindowGBM | None:
    """The GBM of a version whose kind holds one, rebuilt from its skops files (None otherwise)."""
    if ref.kind not in (KIND_SKLEARN, KIND_TORCH_SKLEARN):
        return None
    info = ref.params.get("baseline") or {}
    # versions registered before the degradation features have no "features": the window summaries
    features = [None if f is None else DegradationFeatures.from_dict(f) for f in info.get("features") or [None]]
    features += [None] * (int(info.get("members") or 1) - len(features))
    gbm = WindowGBM(n_threads=int(info.get("n_threads") or 1),
                    features=None if features[0] is None else features[0].groups)
    gbm.features_ = features[0]
    gbm.regressor_ = load_estimator(ref.file(RUL_FILE))
    fail = ref.file(FAIL_FILE)
    gbm.classifier_ = load_estimator(fail) if fail.exists() else None
    gbm.constant_ = info.get("constant_fail")
    constants = info.get("constant_fail_members") or []
    bag = []
    for i in range(1, int(info.get("members") or 1)):  # a bag: the mean of its members' predictions
        fail_i = ref.file(_bag_file(FAIL_FILE, i))
        bag.append((load_estimator(ref.file(_bag_file(RUL_FILE, i))), load_estimator(fail_i) if fail_i.exists() else None,
                    constants[i - 1] if i - 1 < len(constants) else None, features[i]))
    if bag:
        gbm.bag_ = bag
    return gbm
