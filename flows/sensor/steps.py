"""The sensor vertical's steps: thin Prefect tasks over ``solutions.sensor`` functions.

Each step calls a solution function, joins it with a generic task type where one is needed
(a :class:`~tasks.data.DatasetRef` from the prepared store, a metric report from
``tasks.evaluate``) and returns a ref or a small typed result. The flows in this package
only wire these steps and the generic tasks together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NONE

from flows.sensor.accumulated import accumulated_plan
from infra.compute import resolve_training
from infra.registry import ModelRef, ModelRegistry, PromotionDecision
from solutions.sensor import candidates as CA
from solutions.sensor import data as D
from solutions.sensor import evaluate as E
from solutions.sensor import pipeline as P
from solutions.sensor.baseline import WindowGBM
from solutions.sensor.config import ModelConfig, SensorConfig, SensorSource, WindowConfig
from solutions.sensor.features import RegimeNormalizer
from solutions.sensor.inference import predict
from solutions.sensor.model import RULModel, SensorRULEnsemble, SensorRULModel, WindowDataModule
from solutions.sensor.schema import BadReadingReport
from tasks.data import DatasetRef
from tasks.evaluate import EvalReport, choose_threshold, evaluate_binary, render_eval_report
from tasks.evaluate_regression import (
    RegressionReport,
    evaluate_regression,
    plot_pred_vs_true,
    plot_trajectories,
    render_regression_report,
)
from tasks.prepare import materialize_table, materialize_table_task
from tasks.register import render_promotion
from tasks.train import TrainSpec

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------
# data


def grid_table(plan: D.GridPlan, materialize: Callable[..., DatasetRef] = materialize_table,
               ) -> tuple[DatasetRef, BadReadingReport]:
    """The plan's grid from the prepared store (built once per content key) and its bad readings."""

    def build() -> pd.DataFrame:
        grid, report = plan.build()
        D.save_bad_readings(plan, report)
        return grid

    ref = materialize(plan.name, plan.key, build)
    report = D.stored_bad_readings(plan)
    if report is None:  # a grid stored before its counts were: measure them now
        report = plan.build()[1]
        D.save_bad_readings(plan, report)
    return ref, report


def obtain_grid(source: SensorSource, config: SensorConfig) -> tuple[DatasetRef, BadReadingReport]:
    """The aligned grid table of the source and the bad-reading counts its reader measured."""
    if source.origin == "accumulated":
        plan, name = accumulated_plan(config), "align-accumulated"
    elif source.cmapss_dir:
        plan, name = D.cmapss_plan(Path(source.cmapss_dir), source.subset), "read-cmapss"
    elif source.data:
        events = Path(source.events) if source.events else None
        plan, name = D.readings_plan(Path(source.data), events, source.columns, config.align), "align-readings"
    else:
        key = D.fleet_key(config.fleet)
        readings = materialize_table_task.with_options(name="generate-fleet")(
            "sensor-fleet", key, lambda: D.fleet_readings(config.fleet))
        events = materialize_table_task.with_options(name="generate-fleet-events")(
            "sensor-fleet-events", key, lambda: D.fleet_events(config.fleet))
        plan, name = D.readings_plan(Path(readings.path), Path(events.path), {}, config.align), "align-readings"
    ref, report = grid_table(plan, materialize_table_task.with_options(name=name))
    log.info("bad readings: %s", report.summary())
    return ref, report


# ------------------------------------------------------------------------------------
# pre-training


@task(name="prepare-pretrain-windows", cache_policy=NONE)
def pretrain_data_step(grid_ref: DatasetRef, config: SensorConfig, wcfg: WindowConfig) -> P.PretrainData:
    """Splits, normaliser and the unlabelled windows of every non-test asset."""
    return P.pretrain_data(grid_ref.read(), config, wcfg)


def pretrain_spec(grid_ref: DatasetRef, config: SensorConfig, wcfg: WindowConfig, fresh: bool) -> TrainSpec:
    """How to pre-train: the run key of these inputs and the resolved hardware."""
    pcfg = config.pretrain
    return TrainSpec(run_key=P.pretrain_run_key(grid_ref.content_hash, config, wcfg), max_epochs=pcfg.max_epochs,
                     patience=pcfg.patience, monitor="val/loss", seed=pcfg.seed, fresh=fresh,
                     hardware=resolve_training("sensor-pretrain"))


# ------------------------------------------------------------------------------------
# supervised training


@task(name="find-encoder", cache_policy=NONE)
def find_encoder_step(name: str, data_hash: str, model: ModelConfig | None = None) -> ModelRef | None:
    """The registered encoder pre-trained on this data (with the shapes ``model`` builds), if any."""
    return P.encoder_for(ModelRegistry(), name, data_hash, model)


@task(name="prepare-supervised-windows", cache_policy=NONE)
def supervised_setup_step(grid_ref: DatasetRef, config: SensorConfig, wcfg: WindowConfig, bad: BadReadingReport,
                          encoder: ModelRef | None) -> P.SupervisedSetup:
    """Splits, labelled assets and windows (normalised as the encoder was, when fine-tuning)."""
    norm = RegimeNormalizer.from_dict(encoder.params["normalizer"]) if encoder else None
    return P.supervised_setup(grid_ref.read(), config, wcfg, bad, norm)


@task(name="prepare-validation-blocks", cache_policy=NONE)
def validation_block_setups(grid_ref: DatasetRef, config: SensorConfig, wcfg: WindowConfig, bad: BadReadingReport,
                            setup: P.SupervisedSetup) -> list[P.SupervisedSetup]:
    """The setups of cross-fitting (``FinetuneConfig.cross_fit``): ``setup`` (validation block 0) and,
    one per further member while the assets allow, the same data with the next block of assets
    validating and the others training (same normaliser, same test assets); ``[setup]`` alone when
    cross-fitting is off or there is one member."""
    ft = config.finetune
    if not ft.cross_fit or ft.members < 2:
        return [setup]
    grid = grid_ref.read()
    blocks = P.validation_blocks(grid, config.split, ft.members)
    if blocks < ft.members:
        log.info("cross-fitting: the %d non-test assets give %d validation blocks for %d members",
                 len(setup.splits["train"]) + len(setup.splits["val"]), blocks, ft.members)
    setups = [setup] + [P.supervised_setup(grid, config, wcfg, bad, setup.normalizer, block=b) for b in range(1, blocks)]
    log.info("cross-fitting: %d validation blocks, %d validation assets in all",
             len(setups), sum(len(s.splits["val"]) for s in setups))
    return setups


@dataclass(frozen=True)
class OutOfFold:
    """Validation predictions where no model that made them trained on the asset: per block, the
    truth and the network's prediction (the mean of the members validating on that block); the
    RUL on the blocks' cut windows, P(failure) on every window of the blocks (``fail`` its 0/1
    labels, ``network_prob`` the network's), which calibrate the failure-alert threshold."""

    truth: np.ndarray
    network: np.ndarray
    assets: int
    fail: np.ndarray
    network_prob: np.ndarray
    block: np.ndarray | None = None  # each ``truth`` row's validation block (the stack's nested fit)

    @classmethod
    def of(cls, setups: list[P.SupervisedSetup], members: list[RULModel]) -> OutOfFold:
        """Member ``i`` validated on block ``i % len(setups)`` (so never trained on it)."""
        truth, preds, fail, probs, block = [], [], [], [], []
        for b, s in enumerate(setups):
            block.append(np.full(len(s.data.rul_val.rul), b))
            own = [m for i, m in enumerate(members) if i % len(setups) == b]
            preds.append(np.mean([predict(m, s.data.rul_val.x)[0] for m in own], axis=0))
            truth.append(s.data.rul_val.rul)
            probs.append(np.mean([predict(m, s.data.val.x)[1] for m in own], axis=0))
            fail.append(E.fail_labels(s.data.val))
        return cls(np.concatenate(truth), np.concatenate(preds), sum(len(s.splits["val"]) for s in setups),
                   np.concatenate(fail), np.concatenate(probs), np.concatenate(block))

    def rmse(self, pred: np.ndarray) -> float:
        known = ~np.isnan(self.truth)
        return E.rmse(self.truth[known], pred[known]) if known.any() else float("nan")


@task(name="build-predictor", cache_policy=NONE)
def new_predictor_step(setup: P.SupervisedSetup, config: SensorConfig, wcfg: WindowConfig,
                       encoder: ModelRef | None) -> tuple[SensorRULModel, WindowDataModule]:
    """A fresh RUL/failure model, starting from the encoder's weights if one is given."""
    state = ModelRegistry().load_state_dict(encoder) if encoder else None
    return P.new_predictor(setup, config, wcfg, state)


def train_spec(grid_ref: DatasetRef, encoder: ModelRef | None, config: SensorConfig, wcfg: WindowConfig,
               fresh: bool) -> TrainSpec:
    """How to train the RUL/failure model: the run key of these inputs and the resolved hardware."""
    run_key = P.train_run_key(grid_ref.content_hash, encoder.spec if encoder else None, config, wcfg)
    return TrainSpec(run_key=run_key, **P.train_spec_fields(config), fresh=fresh, hardware=resolve_training("sensor-train"))


@task(name="ensemble-cnns", cache_policy=NONE)
def ensemble_step(members: list[SensorRULModel]) -> SensorRULEnsemble:
    """The seed ensemble of the trained CNNs (the mean of their outputs), as one model."""
    log.info("CNN candidate: the mean of %d CNNs trained from consecutive seeds", len(members))
    return SensorRULEnsemble.of(members)


@task(name="choose-network", cache_policy=NONE)
def choose_network_step(models: dict[str, RULModel], data: P.SupervisedData,
                        oof: Mapping[str, OutOfFold] | None = None) -> tuple[str, dict[str, float]]:
    """The encoder trunk whose network has the lowest validation RUL RMSE, and every trunk's
    (``oof``: each trunk's out-of-fold predictions, when cross-fitted)."""
    known = ~np.isnan(data.rul_val.rul)
    val = {arch: (oof[arch].rmse(oof[arch].network) if oof is not None else
                  E.rmse(data.rul_val.rul[known], predict(m, data.rul_val.x)[0][known]) if known.any() else float("nan"))
           for arch, m in models.items()}
    best = CA.best_network(val)
    log.info("network trunks (val RUL RMSE) %s: the %s network is the network candidate", val, best)
    return best, val


@task(name="predict-test-windows", cache_policy=NONE)
def predict_cnn_step(model: RULModel, data: P.SupervisedData) -> E.TestPredictions:
    """The trained CNN's predictions on the validation and test windows."""
    return E.predict_cnn(model, data)


@task(name="fit-baseline", cache_policy=NONE)
def baseline_step(data: P.SupervisedData, seed: int) -> E.TestPredictions:
    """Fit the gradient-boosting baseline on per-window summary features; its predictions."""
    return E.predict_baseline(E.fit_baseline(data.train, seed), data)


@dataclass(frozen=True)
class BaselineCandidate:
    """The GBM fitted on the training windows and its predictions on the test protocol; when
    cross-fitted, the mean of one GBM per validation block (``oof``: each block's GBM on its own
    block, in :class:`OutOfFold` order)."""

    gbm: Any
    predictions: E.TestPredictions
    oof: np.ndarray | None = None
    oof_prob: np.ndarray | None = None


@task(name="fit-baseline", cache_policy=NONE)
def baseline_candidate_step(data: P.SupervisedData, seed: int,
                            blocks: list[P.SupervisedSetup] | None = None) -> BaselineCandidate:
    """Fit the gradient-boosting baseline on the training windows; the model and its predictions.
    ``blocks`` (cross-fitting, two or more): one GBM per block's training windows, the candidate
    their mean, and each block's GBM's predictions on its own validation block."""
    if blocks is None or len(blocks) < 2:
        gbm = E.fit_baseline(data.train, seed)
        return BaselineCandidate(gbm=gbm, predictions=E.predict_baseline(gbm, data))
    fitted = [E.fit_baseline(b.data.train, seed) for b in blocks]
    gbm = WindowGBM.bag(fitted)
    oof = np.concatenate([g.predict_rul(b.data.rul_val.x, b.data.rul_val.end_step)
                          for g, b in zip(fitted, blocks, strict=True)])
    oof_prob = np.concatenate([g.predict_fail_proba(b.data.val.x, b.data.val.end_step)
                               for g, b in zip(fitted, blocks, strict=True)])
    log.info("GBM candidate: the mean of %d GBMs, one per validation block", len(fitted))
    return BaselineCandidate(gbm=gbm, predictions=E.predict_baseline(gbm, data), oof=oof, oof_prob=oof_prob)


def calibration_set(winner: str, oof: OutOfFold | None, baseline: BaselineCandidate | None,
                    weights: tuple[float, float] = (0.5, 0.5)) -> tuple[np.ndarray, np.ndarray] | None:
    """Cross-fitted: the failure labels and the out-of-fold P(failure) of candidate ``winner``
    (``cnn``, ``baseline``, or ``ensemble``/``stack``: the two blended by ``weights``) on every
    block's validation windows, to calibrate its alert threshold on; None when not cross-fitted."""
    if oof is None:
        return None
    if winner == CA.CNN:
        return oof.fail, oof.network_prob
    if baseline is None or baseline.oof_prob is None:
        raise ValueError(f"the {winner} candidate's threshold needs the GBM's out-of-fold P(failure)")
    if winner == CA.BASELINE:
        return oof.fail, baseline.oof_prob
    wc, wg = weights
    return oof.fail, (wc * oof.network_prob + wg * baseline.oof_prob) / max(wc + wg, 1e-12)


@task(name="choose-candidate", cache_policy=NONE)
def choose_candidate_step(model: RULModel, baseline: BaselineCandidate | None,
                          data: P.SupervisedData, networks: dict[str, float] | None = None,
                          oof: OutOfFold | None = None) -> CA.SensorChoice:
    """CNN, GBM or their mean: the lowest validation RUL RMSE wins (the test assets only report);
    ``networks``: each trained trunk's validation RMSE, when several were (``model`` is the best).
    ``oof``: cross-fitted, the choice pools every block's out-of-fold predictions (the baseline's too)."""
    if oof is not None:
        gbm_oof = baseline.oof if baseline is not None else None
        if baseline is not None and gbm_oof is None:
            raise ValueError("cross-fitted validation needs the GBM's out-of-fold predictions")
        choice = CA.choose_on_validation(oof.truth, oof.network, gbm_oof, networks, val_assets=oof.assets,
                                         block=oof.block)
    else:
        cnn_val, _ = predict(model, data.rul_val.x)
        gbm_val = baseline.gbm.predict_rul(data.rul_val.x, data.rul_val.end_step) if baseline is not None else None
        choice = CA.choose_on_validation(data.rul_val.rul, cnn_val, gbm_val, networks)
    log.info("candidates (val RUL RMSE) %s: registering the %s", choice.val_rmse, choice.winner)
    return choice


def ensemble_predictions(cnn: E.TestPredictions, gbm: E.TestPredictions,
                         weights: tuple[float, float] = (0.5, 0.5)) -> E.TestPredictions:
    """Two models' predictions blended: RUL by ``weights`` (the mean by default, a stack's
    weights), P(failure) by the same weights scaled to sum to one."""
    wc, wg = weights
    pc, pg = wc / max(wc + wg, 1e-12), wg / max(wc + wg, 1e-12)
    rul_all = wc * cnn.rul_all + wg * gbm.rul_all if cnn.rul_all is not None and gbm.rul_all is not None else None
    return E.TestPredictions(wc * cnn.rul_last + wg * gbm.rul_last, pc * cnn.prob_val + pg * gbm.prob_val,
                             pc * cnn.prob_all + pg * gbm.prob_all, rul_all)


@dataclass(frozen=True)
class WinnerRegistration:
    """What ``register-model`` stores for the winner: module (None for the GBM), kind, files, params."""

    module: Any
    kind: str
    extra_files: dict[str, Path]
    params: dict[str, Any]


@task(name="prepare-registration", cache_policy=NONE)
def winner_registration_step(choice: CA.SensorChoice, model: RULModel, baseline: BaselineCandidate | None,
                             out_dir: Path) -> WinnerRegistration:
    """The winner's module, kind and files (skops for a GBM); its params beside the shared ones."""
    if choice.winner == CA.CNN or baseline is None:
        return WinnerRegistration(model, choice.kind, {}, {"candidate": choice.winner})
    files = CA.baseline_files(baseline.gbm, out_dir / "baseline")
    stack = {"stack": choice.stack} if choice.winner == CA.STACK else {}
    return WinnerRegistration(None if choice.winner == CA.BASELINE else model, choice.kind, files,
                              {"candidate": choice.winner, **CA.baseline_params(baseline.gbm), **stack})


@dataclass(frozen=True)
class ModelEvaluation:
    """One model on the test protocol: RUL report, failure report, alert threshold and lead times."""

    rul: RegressionReport
    failure: EvalReport | None
    threshold: float
    alerts: dict[str, float]


@task(name="evaluate-predictions", cache_policy=NONE)
def evaluate_step(name: str, data: P.SupervisedData, pred: E.TestPredictions, threshold: float | None,
                  horizon: int, out_dir: Path, failure_name: str | None = None,
                  calibrate: tuple[np.ndarray, np.ndarray] | None = None) -> ModelEvaluation:
    """RUL metrics on the last test windows; failure metrics at a threshold (max F1 on validation if None).

    ``failure_name`` names the failure report and its plot files (default: ``name``).
    ``calibrate``: the (labels, P(failure)) the threshold is chosen on instead of the validation
    windows' (cross-fitted: every block's, out of fold; :func:`calibration_set`).
    """
    rul = evaluate_regression(data.test_last.rul, pred.rul_last, name=name, split="test",
                              extra=E.rul_metrics(data.test_last, pred.rul_last))
    yv, pv = calibrate if calibrate is not None else (E.fail_labels(data.val), pred.prob_val)
    yt = E.fail_labels(data.test_all)
    if threshold is None:
        threshold = choose_threshold(yv, pv, method="f1") if E.has_both_classes(yv) else 0.5
    failure = None
    if E.has_both_classes(yt):
        failure = evaluate_binary(yt, pred.prob_all, name=failure_name or name, split="test", threshold=threshold,
                                  out_dir=out_dir)
    else:
        log.warning("%s: the test windows hold one class only; no PR-AUC", name)
    return ModelEvaluation(rul, failure, float(threshold), E.alerts(data, pred, threshold, horizon))


@task(name="plot-rul", cache_policy=NONE)
def plot_rul_step(data: P.SupervisedData, cnn: E.TestPredictions, baseline: E.TestPredictions | None,
                  out_dir: Path) -> list[Path]:
    """Predicted-vs-true RUL (CNN and baseline) and a few test assets' RUL trajectories."""
    series = [("cnn", data.test_last.rul, cnn.rul_last)]
    if baseline is not None:
        series.append((E.BASELINE_NAME, data.test_last.rul, baseline.rul_last))
    images = [plot_pred_vs_true(series, out_dir / "rul_pred_vs_true.png", title="RUL on the last window of each test unit")]
    traj = E.trajectories(data.test_all, cnn.rul_all) if cnn.rul_all is not None else {}
    if traj:
        images.append(plot_trajectories(traj, out_dir / "rul_trajectories.png"))
    return images


def train_metrics(cnn: ModelEvaluation, baseline: ModelEvaluation | None) -> dict[str, float]:
    """The metrics registered with the new version (finite ones only)."""
    return E.registry_metrics(
        cnn.rul.metrics(), cnn.alerts,
        {"test/pr_auc": cnn.failure.pr_auc, "test/f1": cnn.failure.f1} if cnn.failure else None,
        baseline.rul.metrics() if baseline else None,
        {"test/pr_auc": baseline.failure.pr_auc} if baseline and baseline.failure else None,
    )


@task(name="write-train-report", cache_policy=NONE)
def train_report_step(title: str, cnn: ModelEvaluation, baseline: ModelEvaluation | None, horizon: int,
                      bad: BadReadingReport, decision: PromotionDecision, images: list[Path], out_dir: Path) -> str:
    """The run's markdown report, written to ``report.md`` in its report folder."""
    rul = [cnn.rul] + ([baseline.rul] if baseline else [])
    failure = [r for r in (cnn.failure, baseline.failure if baseline else None) if r]
    markdown = (
        render_regression_report(rul, title=title, images=images) + "\n"
        + (render_eval_report(failure, title=f"failure within {horizon} steps") if cnn.failure else "")
        + f"\n\nAlerts (threshold {cnn.threshold:.3f}): {cnn.alerts}\n\nBad readings: {bad.summary()}\n\n"
        + render_promotion(decision)
    )
    (out_dir / "report.md").write_text(markdown)
    return markdown
