"""Sensor fault prediction flows: ``pretrain``, ``train``, ``score`` and ``batch`` (inbox scoring).

Run ``python -m flows.sensor <command> --help``. Input is the seeded synthetic fleet by
default, a long-format readings file (``--data``, ``--events``, ``--columns``) or the NASA
C-MAPSS files (``--cmapss-dir DIR --subset FD001``). Each command accepts ``--json`` and
then prints the flow's typed result as one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import flow, task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from flows._cli import add_common, parse_columns, run_command
from infra.compute import resolve_training
from infra.errors import DataValidationError
from infra.home import home_layout
from infra.registry import ModelRef, ModelRegistry, PromotionDecision
from infra.runners import ConfiguredTaskRunner
from infra.store import atomic_path, safe_stem, sha256_file, stable_hash, write_json_atomic
from solutions.sensor import pipeline as P
from solutions.sensor import schema as S
from solutions.sensor.align import load_readings
from solutions.sensor.baseline import WindowGBM
from solutions.sensor.cmapss import REGIMES, check_subset, load_cmapss
from solutions.sensor.config import (
    FinetuneConfig,
    PretrainConfig,
    SensorConfig,
    SyntheticFleetConfig,
    WindowConfig,
)
from solutions.sensor.features import RegimeNormalizer, WindowSet, make_windows
from solutions.sensor.model import WindowDataModule, build_module, predict, predict_outputs
from solutions.sensor.schema import BadReadingReport, ColumnMapping
from solutions.sensor.synthetic import generate_fleet
from tasks.compress import load_variant
from tasks.data import DatasetRef
from tasks.evaluate import (
    EvalReport,
    artifact_key,
    choose_threshold,
    evaluate_binary,
    publish_eval_report_task,
    render_eval_report,
)
from tasks.evaluate_regression import (
    RegressionReport,
    evaluate_regression,
    plot_pred_vs_true,
    plot_trajectories,
    render_regression_report,
)
from tasks.finetune import FreezeReport, finetune_model_task
from tasks.ledger import InboxFile, InboxRun, ScoredFile, inbox_summary, process_inbox
from tasks.prepare import materialize_table, materialize_table_task
from tasks.register import register_model_task, render_promotion
from tasks.train import TrainResult, TrainSpec, train_model_task

log = logging.getLogger("flows.sensor")  # not __main__ under python -m
PRIMARY_METRIC = "test/rmse"
ENCODER_METRIC = "val/masked_mse"
PROGRESSIVE_GROUPS = ("heads", "encoder.proj", "encoder.convs")


# ------------------------------------------------------------------------------------
# parameters and results


class SensorSource(BaseModel):
    """Where the readings come from: a C-MAPSS folder, a long-format file, or the synthetic fleet."""

    model_config = ConfigDict(frozen=True)

    data: str | None = Field(default=None, description="Long-format readings (CSV/Parquet).")
    events: str | None = Field(default=None, description="Failure events (CSV/Parquet): asset_id, failure_time, failure_type.")
    columns: dict[str, str] = Field(default_factory=dict, description="canonical -> source column names.")
    cmapss_dir: str | None = Field(default=None, description="Folder with train_FDxxx.txt, test_FDxxx.txt, RUL_FDxxx.txt.")
    subset: str = Field(default="FD001", description="C-MAPSS subset.")

    def describe(self) -> str:
        if self.cmapss_dir:
            return f"C-MAPSS {self.subset} in {self.cmapss_dir}"
        return self.data or "synthetic fleet"


class SensorPretrainResult(BaseModel):
    """What ``sensor-pretrain`` produced."""

    model_config = ConfigDict(frozen=True)

    dataset: DatasetRef
    bad_readings: BadReadingReport
    assets: dict[str, int] = Field(description="Assets per split.")
    windows: dict[str, int]
    channels: list[str]
    train: TrainResult
    model: ModelRef
    promotion: PromotionDecision
    seconds: float


class SensorTrainResult(BaseModel):
    """What ``sensor-train`` produced."""

    model_config = ConfigDict(frozen=True)

    dataset: DatasetRef
    bad_readings: BadReadingReport
    pretrained_from: str | None
    label_fraction: float
    labelled_assets: int
    assets: dict[str, int]
    windows: dict[str, int]
    train: TrainResult
    freeze: FreezeReport | None
    rul: RegressionReport
    baseline_rul: RegressionReport | None
    failure: EvalReport | None
    baseline_failure: EvalReport | None
    alerts: dict[str, float] = Field(description="Lead time of the CNN's first alerts on failed test assets.")
    threshold: float
    winner: str = Field(description="Lower test RMSE: cnn or baseline.")
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str
    seconds: float


class SensorScoreResult(BaseModel):
    """What ``sensor-score`` wrote."""

    model_config = ConfigDict(frozen=True)

    model: str
    input: str
    assets_scored: int
    alerts: int
    threshold: float
    output: str
    csv_output: str | None
    bad_readings: BadReadingReport


# ------------------------------------------------------------------------------------
# data steps


def _fleet_readings(cfg: SyntheticFleetConfig) -> pd.DataFrame:
    return generate_fleet(cfg)[0]


def _fleet_events(cfg: SyntheticFleetConfig) -> pd.DataFrame:
    return generate_fleet(cfg)[1]


def _readings_grid(data: Path, events: Path | None, columns: dict[str, str], config: SensorConfig) -> tuple[DatasetRef, BadReadingReport]:
    mapping = ColumnMapping(columns)
    key = {
        "file": sha256_file(data) if data.exists() else str(data),
        "events": sha256_file(events) if events and events.exists() else None,
        "columns": columns,
        "align": config.align.model_dump(),
        "v": P.GRID_VERSION,
    }
    report_path = home_layout().prepared() / f"sensor-bad-readings-{stable_hash(key)}.json"

    def build() -> pd.DataFrame:
        grid, report = load_readings(data, mapping, config.align, events)
        write_json_atomic(report_path, report.model_dump())
        return grid

    ref = materialize_table_task.with_options(name="align-readings")("sensor-grid", key, build)
    report = (
        BadReadingReport.model_validate_json(report_path.read_text()) if report_path.exists()
        else BadReadingReport(source=str(data))
    )
    return ref, report


def obtain_grid(source: SensorSource, config: SensorConfig) -> tuple[DatasetRef, BadReadingReport]:
    """The aligned grid table of the source, stored once per content key; bad-reading counts."""
    if source.cmapss_dir:
        folder = Path(source.cmapss_dir).expanduser()
        subset = check_subset(source.subset)
        files = [folder / f"{kind}_{subset}.txt" for kind in ("train", "test", "RUL")]
        key = {"files": [sha256_file(f) if f.exists() else str(f) for f in files], "v": P.GRID_VERSION}
        ref = materialize_table_task.with_options(name="read-cmapss")(
            f"sensor-cmapss-{subset.lower()}", key, lambda: load_cmapss(folder, subset)
        )
        return ref, BadReadingReport(source=str(folder), readings_in=ref.n_rows * 24, readings_used=ref.n_rows * 24)
    if source.data:
        events = Path(source.events).expanduser() if source.events else None
        return _readings_grid(Path(source.data).expanduser(), events, dict(source.columns), config)
    fleet = config.fleet
    key = {"fleet": fleet.model_dump(), "v": "1"}
    readings = materialize_table_task.with_options(name="generate-fleet")("sensor-fleet", key, lambda: _fleet_readings(fleet))
    events = materialize_table_task.with_options(name="generate-fleet-events")("sensor-fleet-events", key, lambda: _fleet_events(fleet))
    return _readings_grid(Path(readings.path), Path(events.path), {}, config)


def window_config(source: SensorSource, config: SensorConfig) -> WindowConfig:
    """The window settings, with C-MAPSS regime counts known per subset."""
    w = config.window
    if source.cmapss_dir:
        update: dict = {"test_cuts": 1}
        if w.n_regimes == "auto":
            update["n_regimes"] = REGIMES.get(check_subset(source.subset), "auto")
        w = w.model_copy(update=update)
    return w


def _encoder_for(name: str, data_hash: str) -> ModelRef | None:
    """The champion encoder if it was pre-trained on this data, else the latest that was."""
    registry = ModelRegistry()
    if name not in registry.models():
        return None
    champion = registry.champion(name)
    if champion is not None and champion.data_hash == data_hash:
        return champion
    same = [v for v in registry.versions(name) if v.data_hash == data_hash]
    return same[-1] if same else None


@task(name="fit-baseline", cache_policy=NONE)
def fit_baseline_step(train: WindowSet, seed: int) -> WindowGBM:
    """Fit the gradient-boosting baseline on per-window summary features."""
    step = max(1, len(train) // 4000)
    return WindowGBM(random_state=seed).fit(train.x[::step], train.rul[::step], train.fail[::step])


def _report_dir(kind: str) -> Path:
    path = home_layout().new_report(kind)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}


def _rul_report(name: str, ws: WindowSet, pred: np.ndarray) -> RegressionReport:
    extra = P.rul_extra(ws.rul, pred)
    extra["rmse_uncapped_truth"] = float(np.sqrt(np.mean((pred - ws.rul_raw) ** 2)))
    return evaluate_regression(ws.rul, pred, name=name, split="test", extra=extra)


def _failure_report(name: str, val: WindowSet, val_prob: np.ndarray, test: WindowSet, test_prob: np.ndarray,
                    threshold: float | None, out_dir: Path) -> tuple[EvalReport | None, float]:
    yv, yt = val.fail.astype(int), test.fail.astype(int)
    if threshold is None:
        threshold = choose_threshold(yv, val_prob, method="f1") if 0 < yv.sum() < len(yv) else 0.5
    if not 0 < yt.sum() < len(yt):
        log.warning("%s: the test windows hold one class only; no PR-AUC", name)
        return None, threshold
    return evaluate_binary(yt, test_prob, name=name, split="test", threshold=threshold, out_dir=out_dir), threshold


def _champion_rmse(name: str, data: P.SupervisedData) -> float | None:
    """The current champion's RMSE on this run's test cuts (a fair comparison), if it fits."""
    registry = ModelRegistry()
    champion = registry.champion(name) if name in registry.models() else None
    if champion is None:
        return None
    try:
        model, norm, wcfg = P.predictor_from_params(champion.params, registry.load_state_dict(champion))
        ws = make_windows(data.test_cut_grid, norm, length=wcfg.length, rul_cap=wcfg.rul_cap, horizon=wcfg.horizon,
                          last_only=True, pad=True).labelled()
        pred, _ = predict(model, ws.x)
    except (KeyError, ValueError, RuntimeError) as exc:
        log.warning("could not re-score champion %s on this data (%s); using its stored metric", champion.spec, exc)
        return None
    return float(np.sqrt(np.mean((pred - ws.rul) ** 2)))


# ------------------------------------------------------------------------------------
# flows


@flow(name="sensor-pretrain", log_prints=True)
def sensor_pretrain(source: SensorSource = SensorSource(), config: SensorConfig = SensorConfig(), fresh: bool = False) -> SensorPretrainResult:
    """Pre-train the 1D-CNN encoder by masked reconstruction on the unlabelled windows of
    every non-test asset (censored ones included) and register it."""
    started = time.perf_counter()
    grid_ref, bad = obtain_grid(source, config)
    log.info("bad readings: %s", bad.summary())
    grid = grid_ref.read()
    wcfg = window_config(source, config)
    splits = P.split_assets(grid, config.split)
    norm = P.fit_normalizer(grid, splits["train"] + splits["val"], wcfg, config.align.op_prefix, config.split.seed)
    pcfg = config.pretrain
    train_ws, val_ws = P.pretrain_windows(grid, splits, norm, wcfg, pcfg.stride)
    module = P.build_pretrainer(len(norm.channels_), config.model, pcfg)
    dm = WindowDataModule((train_ws.x,), (val_ws.x,), pcfg.batch_size, seed=pcfg.seed)
    run_key = "sensor-pre-" + stable_hash({
        "data": grid_ref.content_hash, "model": config.model.model_dump(), "pretrain": pcfg.model_dump(),
        "window": wcfg.model_dump(), "split": config.split.model_dump(), "v": "1",
    })
    spec = TrainSpec(run_key=run_key, max_epochs=pcfg.max_epochs, patience=pcfg.patience, monitor="val/loss", seed=pcfg.seed, fresh=fresh, hardware=resolve_training("sensor-pretrain"))
    trained = train_model_task(module, dm, spec)
    registration = register_model_task(
        config.encoder_name,
        module,
        params={
            "architecture": "MaskedReconstruction", "hparams": dict(module.hparams), "normalizer": norm.to_dict(),
            "window": wcfg.model_dump(), "split": config.split.model_dump(),
        },
        metrics={ENCODER_METRIC: float(trained.best_score if trained.best_score is not None else np.nan)},
        primary_metric=ENCODER_METRIC,
        higher_is_better=False,
        data_hash=grid_ref.content_hash,
        tags={"kind": "encoder"},
    )
    publish_eval_report_task(
        f"## sensor-pretrain\n\n{source.describe()}: {len(train_ws)} train / {len(val_ws)} val windows, "
        f"{len(norm.channels_)} channels, val masked MSE {trained.best_score}\n\n{bad.summary()}\n\n"
        + render_promotion(registration.decision),
        key=artifact_key("sensor-pretrain-report"), description="Encoder pre-training",
    )
    return SensorPretrainResult(
        dataset=grid_ref, bad_readings=bad, assets={k: len(v) for k, v in splits.items()},
        windows={"train": len(train_ws), "val": len(val_ws)}, channels=norm.channels_, train=trained,
        model=registration.model, promotion=registration.decision, seconds=time.perf_counter() - started,
    )


@flow(name="sensor-train", log_prints=True)
def sensor_train(
    source: SensorSource = SensorSource(),
    config: SensorConfig = SensorConfig(),
    fresh: bool = False,
    strict: bool = False,
) -> SensorTrainResult:
    """Fine-tune the pre-trained encoder with RUL and failure-within-horizon heads on the
    labelled share of the training assets (or train from scratch), evaluate it beside a
    gradient-boosting baseline on the same test assets, register it and promote it if its
    test RMSE beats the champion's. Pre-trains first when no encoder fits the data."""
    started = time.perf_counter()
    ft: FinetuneConfig = config.finetune
    grid_ref, bad = obtain_grid(source, config)
    log.info("bad readings: %s", bad.summary())
    grid = grid_ref.read()
    wcfg = window_config(source, config)
    splits = P.split_assets(grid, config.split)
    # -- encoder
    encoder_ref, state = None, None
    if ft.pretrained:
        encoder_ref = _encoder_for(config.encoder_name, grid_ref.content_hash)
        if encoder_ref is None:
            log.info("no %s pre-trained on this data: pre-training first", config.encoder_name)
            encoder_ref = sensor_pretrain(source, config).model
        registry = ModelRegistry()
        state = registry.load_state_dict(encoder_ref)
        norm = RegimeNormalizer.from_dict(encoder_ref.params["normalizer"])
    else:
        norm = P.fit_normalizer(grid, splits["train"] + splits["val"], wcfg, config.align.op_prefix, config.split.seed)
    # -- labelled windows
    labelled = P.labelled_assets(grid, splits["train"], ft.label_fraction, ft.seed)
    data = P.supervised_windows(grid, splits, labelled, norm, wcfg, bad, config.split.seed)
    log.info("label fraction %.0f%%: %d labelled assets, %d windows", 100 * ft.label_fraction, len(labelled), len(data.train))
    model = P.build_predictor(len(norm.channels_), config.model, wcfg, ft.lr, data.train.fail)
    if state is not None:
        model.load_encoder(state)
    dm = WindowDataModule(
        (data.train.x, data.train.rul, data.train.fail), (data.val.x, data.val.rul, data.val.fail),
        ft.batch_size, ft.min_samples_per_epoch, ft.seed,
    )
    run_key = "sensor-rul-" + stable_hash({
        "data": grid_ref.content_hash, "encoder": encoder_ref.spec if encoder_ref else None, "cfg": ft.model_dump(),
        "model": config.model.model_dump(), "window": wcfg.model_dump(), "split": config.split.model_dump(), "v": "1",
    })
    spec = TrainSpec(run_key=run_key, max_epochs=ft.max_epochs, patience=ft.patience, monitor="val/rmse", mode="min", seed=ft.seed, fresh=fresh, hardware=resolve_training("sensor-train"))
    freeze = None
    if state is not None:
        tuned = finetune_model_task(model, dm, spec, mode=ft.mode, groups=PROGRESSIVE_GROUPS if ft.mode == "progressive" else (),
                                    every_n_epochs=ft.unfreeze_every)
        trained, freeze = tuned.train, tuned.freeze
    else:
        trained = train_model_task(model, dm, spec)
    # -- evaluate the CNN and the baseline on the same test assets
    out_dir = _report_dir("sensor-train")
    pred_last, _ = predict(model, data.test_last.x)
    rul = _rul_report("cnn", data.test_last, pred_last)
    _, val_prob = predict(model, data.val.x)
    pred_all, test_prob = predict(model, data.test_all.x)
    failure, threshold = _failure_report("cnn", data.val, val_prob, data.test_all, test_prob, ft.alert_threshold, out_dir)
    alerts = P.lead_metrics(data.test_all, test_prob, threshold, wcfg.horizon)
    baseline_rul = baseline_failure = None
    series = [("cnn", data.test_last.rul, pred_last)]
    if config.baseline:
        gbm = fit_baseline_step(data.train, ft.seed)
        b_last = gbm.predict_rul(data.test_last.x)
        baseline_rul = _rul_report("baseline (HistGB)", data.test_last, b_last)
        baseline_failure, _ = _failure_report(
            "baseline", data.val, gbm.predict_fail_proba(data.val.x), data.test_all, gbm.predict_fail_proba(data.test_all.x), None, out_dir
        )
        series.append(("baseline (HistGB)", data.test_last.rul, b_last))
    images = [plot_pred_vs_true(series, out_dir / "rul_pred_vs_true.png", title="RUL on the last window of each test unit")]
    units = list(dict.fromkeys(data.test_all.asset))[:3]
    if units:
        traj = {str(u): (data.test_all.end_step[data.test_all.asset == u], data.test_all.rul[data.test_all.asset == u],
                         pred_all[data.test_all.asset == u]) for u in units}
        images.append(plot_trajectories(traj, out_dir / "rul_trajectories.png"))
    # -- register + champion rule (champion re-scored on the same test cuts)
    metrics = {**rul.metrics(), **({f"test/{k}": v for k, v in alerts.items()})}
    if failure:
        metrics.update({"test/pr_auc": failure.pr_auc, "test/f1": failure.f1})
    if baseline_rul:
        metrics.update({f"baseline/{k}": v for k, v in baseline_rul.metrics().items()})
    if baseline_failure:
        metrics.update({"baseline/test/pr_auc": baseline_failure.pr_auc})
    registration = register_model_task(
        config.model_name,
        model,
        params=P.model_params(model, norm, wcfg, threshold=threshold, label_fraction=ft.label_fraction,
                              split=config.split.model_dump(), encoder=encoder_ref.spec if encoder_ref else None),
        metrics=_finite(metrics),
        primary_metric=PRIMARY_METRIC,
        higher_is_better=False,
        data_hash=grid_ref.content_hash,
        parent=encoder_ref.spec if encoder_ref else None,
        champion_value=_champion_rmse(config.model_name, data),
        strict=strict,
    )
    winner = "baseline" if baseline_rul is not None and baseline_rul.rmse < rul.rmse else "cnn"
    markdown = (
        render_regression_report([r for r in (rul, baseline_rul) if r], title=f"sensor-train: RUL, {source.describe()}", images=images)
        + "\n" + (render_eval_report([r for r in (failure, baseline_failure) if r], title=f"failure within {wcfg.horizon} steps") if failure else "")
        + f"\n\nAlerts (threshold {threshold:.3f}): {alerts}\n\nBad readings: {bad.summary()}\n\n"
        + render_promotion(registration.decision)
    )
    (out_dir / "report.md").write_text(markdown)
    publish_eval_report_task(markdown, key=artifact_key("sensor-train-report"), description="RUL / failure model vs baseline")
    return SensorTrainResult(
        dataset=grid_ref, bad_readings=bad, pretrained_from=encoder_ref.spec if encoder_ref else None,
        label_fraction=ft.label_fraction, labelled_assets=len(labelled), assets={k: len(v) for k, v in splits.items()},
        windows={"train": len(data.train), "val": len(data.val), "test_last": len(data.test_last), "test_all": len(data.test_all)},
        train=trained, freeze=freeze, rul=rul, baseline_rul=baseline_rul, failure=failure, baseline_failure=baseline_failure,
        alerts=alerts, threshold=threshold, winner=winner, model=registration.model, promotion=registration.decision,
        report_dir=str(out_dir), seconds=time.perf_counter() - started,
    )


def score_grid(ref_model: ModelRef, registry: ModelRegistry, grid: pd.DataFrame, bad: BadReadingReport | None,
               threshold: float) -> pd.DataFrame:
    """Predicted RUL, failure probability and alert flag of each asset's latest window."""
    if "compression" in ref_model.params:  # an INT8 / pruned / distilled variant (flows.compress)
        norm, wcfg = P.preprocessing_from_params(ref_model.params)
        ws = make_windows(grid, norm, length=wcfg.length, rul_cap=wcfg.rul_cap, horizon=wcfg.horizon, last_only=True, pad=True, report=bad)
        rul, prob = predict_outputs(load_variant(ref_model, registry, build_module), ws.x,
                                    float(ref_model.params["hparams"].get("rul_cap", wcfg.rul_cap)))
    else:
        net, norm, wcfg = P.predictor_from_params(ref_model.params, registry.load_state_dict(ref_model))
        ws = make_windows(grid, norm, length=wcfg.length, rul_cap=wcfg.rul_cap, horizon=wcfg.horizon, last_only=True, pad=True, report=bad)
        rul, prob = predict(net, ws.x)
    return pd.DataFrame({
        S.ASSET: ws.asset.astype(str), S.STEP: ws.end_step, "predicted_rul": rul, "failure_probability": prob,
        "alert": prob >= threshold, "model": ref_model.name, "model_version": ref_model.version,
    })


def _write_scores(out: pd.DataFrame, target: Path, csv: bool) -> Path | None:
    with atomic_path(target) as tmp:
        out.to_parquet(tmp, index=False)
    if not csv:
        return None
    csv_path = target.with_suffix(".csv")
    with atomic_path(csv_path) as tmp:
        out.to_csv(tmp, index=False)
    return csv_path


@flow(name="sensor-score", log_prints=True)
def sensor_score(
    source: SensorSource = SensorSource(),
    model: str = "sensor-rul",
    output: str | None = None,
    csv: bool = False,
    threshold: float | None = None,
    config: SensorConfig = SensorConfig(),
) -> SensorScoreResult:
    """Score the latest window of each asset with the champion (or a named version):
    predicted RUL, failure probability and an alert flag; written out with the model version."""
    registry = ModelRegistry()
    ref_model = registry.resolve(model)
    cut = float(threshold if threshold is not None else ref_model.params.get("threshold", 0.5))
    grid_ref, bad = obtain_grid(source, config)
    grid = grid_ref.read()
    if source.cmapss_dir:
        grid = grid.loc[grid[S.SET] == "test"]
    out = score_grid(ref_model, registry, grid, bad, cut)
    named = source.data or (f"cmapss-{source.subset.lower()}" if source.cmapss_dir else "synthetic-fleet")
    target = Path(output).expanduser() if output else (
        home_layout().scores() / f"{safe_stem(named)}-{ref_model.name}-v{ref_model.version}.parquet"
    )
    csv_path = _write_scores(out, target, csv)
    markdown = (
        f"## sensor-score with {ref_model.spec}\n\n| | |\n|---|---|\n| input | {source.describe()} |\n"
        f"| assets scored | {len(out)} |\n| alerts (P ≥ {cut:.3g}) | {int(out['alert'].sum())} |\n"
        f"| output | `{target}` |\n\nBad readings: {bad.summary()}\n"
    )
    publish_eval_report_task(markdown, key=artifact_key("sensor-score-summary"), description="Latest-window scoring")
    return SensorScoreResult(
        model=ref_model.spec, input=source.describe(), assets_scored=len(out), alerts=int(out["alert"].sum()),
        threshold=cut, output=str(target), csv_output=str(csv_path) if csv_path else None, bad_readings=bad,
    )


class SensorBatchScoreResult(InboxRun):
    """What one ``sensor-batch-score`` run did with the inbox: ``rows`` assets scored (their
    latest window), ``flagged`` of them alerting (P(failure) at or above the threshold)."""


def score_readings_file(file: InboxFile, *, model: str, columns: dict[str, str], threshold: float | None,
                        config: SensorConfig, out_dir: str, csv: bool) -> ScoredFile:
    """Score the latest window of every asset in one long-format readings file."""
    registry = ModelRegistry()
    ref_model = registry.resolve(model)
    cut = float(threshold if threshold is not None else ref_model.params.get("threshold", 0.5))
    path = Path(file.path)
    key = {"file": file.sha256, "events": None, "columns": columns, "align": config.align.model_dump(), "v": P.GRID_VERSION}
    reports: list[BadReadingReport] = []

    def build() -> pd.DataFrame:
        grid, report = load_readings(path, ColumnMapping(columns), config.align, None)
        reports.append(report)
        return grid

    grid = materialize_table("sensor-grid", key, build).read()
    out = score_grid(ref_model, registry, grid, reports[0] if reports else None, cut)
    if out.empty:
        raise DataValidationError("no asset has a complete window of readings", source=str(path))
    stem = safe_stem(path)
    target = Path(out_dir) / f"{stem}-{file.sha256[:12]}-{ref_model.name}-v{ref_model.version}.parquet"
    _write_scores(out, target, csv)
    return ScoredFile(output=str(target), rows=len(out), model=ref_model.spec, flagged=int(out["alert"].sum()))


@flow(name="sensor-batch-score", log_prints=True, task_runner=ConfiguredTaskRunner())
def sensor_batch_score(
    inbox: str | None = None,
    model: str = "sensor-rul",
    columns: dict[str, str] | None = None,
    threshold: float | None = None,
    output_dir: str | None = None,
    csv: bool = False,
    settle_seconds: float = 30.0,
    config: SensorConfig = SensorConfig(),
) -> SensorBatchScoreResult:
    """Score every new long-format readings file (CSV/Parquet) in ``inbox`` with the champion:
    each asset's latest window gets predicted RUL, failure probability and an alert flag.

    ``inbox`` is a folder or a glob (default ``<home>/inbox/sensor``). Files are fanned out
    on the configured task runner (threads or Dask). A file handled before is skipped
    (processed-files ledger); an unreadable file is quarantined with its reason."""
    location = inbox or str(home_layout().inbox("sensor"))
    if columns:
        ColumnMapping(dict(columns))
    out_dir = Path(output_dir).expanduser() if output_dir else home_layout().scores("sensor-batch")
    out_dir.mkdir(parents=True, exist_ok=True)
    run = process_inbox(
        "sensor-batch-score", location, model, settle_s=settle_seconds,
        make_scorer=lambda spec: partial(score_readings_file, model=spec, columns=dict(columns or {}),
                                         threshold=threshold, config=config, out_dir=str(out_dir), csv=csv),
    )
    return SensorBatchScoreResult(**run.model_dump())


# ------------------------------------------------------------------------------------
# command line


def _source_args(p: argparse.ArgumentParser, windows: bool = True) -> None:
    g = p.add_argument_group("input data (default: the seeded synthetic fleet)")
    g.add_argument("--data", metavar="FILE", help="long-format readings CSV/Parquet: asset_id, timestamp, sensor, value")
    g.add_argument("--events", metavar="FILE", help="failure events CSV/Parquet: asset_id, failure_time, failure_type")
    g.add_argument("--columns", metavar="MAP", help="column mapping canonical=SOURCE,..., e.g. asset_id=machine,timestamp=ts")
    g.add_argument("--cmapss-dir", metavar="DIR", help="folder with the NASA C-MAPSS train_/test_/RUL_FDxxx.txt files")
    g.add_argument("--subset", default="FD001", help="C-MAPSS subset (default %(default)s)")
    d = SyntheticFleetConfig()
    s = p.add_argument_group("synthetic fleet")
    s.add_argument("--n-assets", type=int, default=d.n_assets, help="default %(default)s")
    s.add_argument("--min-life", type=int, default=d.min_life, help="default %(default)s")
    s.add_argument("--max-life", type=int, default=d.max_life, help="default %(default)s")
    s.add_argument("--seed", type=int, default=d.seed, help="default %(default)s")
    w = WindowConfig()
    if windows:  # scoring takes the window settings from the model
        g2 = p.add_argument_group("windows")
        g2.add_argument("--window", type=int, default=w.length, help="steps per window (default %(default)s)")
        g2.add_argument("--rul-cap", type=float, default=w.rul_cap, help="default %(default)s")
        g2.add_argument("--horizon", type=int, default=w.horizon, help="failure-within-horizon steps (default %(default)s)")
    p.set_defaults(window=w.length, rul_cap=w.rul_cap, horizon=w.horizon)
    add_common(p)


def _source_from(args: argparse.Namespace) -> SensorSource:
    if args.cmapss_dir and args.data:
        raise SystemExit("give either --data or --cmapss-dir, not both")
    return SensorSource(data=args.data, events=args.events, columns=parse_columns(args.columns),
                        cmapss_dir=args.cmapss_dir, subset=args.subset)


def _config_from(args: argparse.Namespace) -> SensorConfig:
    base = SensorConfig()
    update: dict = {
        "fleet": SyntheticFleetConfig(n_assets=args.n_assets, min_life=args.min_life, max_life=args.max_life, seed=args.seed),
        "window": base.window.model_copy(update={"length": args.window, "rul_cap": args.rul_cap, "horizon": args.horizon}),
    }
    if getattr(args, "pretrain_epochs", None):
        update["pretrain"] = PretrainConfig(max_epochs=args.pretrain_epochs)
    if hasattr(args, "label_fraction"):
        update["finetune"] = base.finetune.model_copy(update={
            "label_fraction": args.label_fraction, "pretrained": not args.no_pretrain, "max_epochs": args.max_epochs,
        })
        update["baseline"] = not args.no_baseline
        update["model_name"] = args.model_name
    if getattr(args, "encoder_name", None):
        update["encoder_name"] = args.encoder_name
    return base.model_copy(update=update)


def _train_summary(r: SensorTrainResult) -> str:
    origin = f"fine-tuned from {r.pretrained_from}" if r.pretrained_from else "from scratch"
    lines = [
        f"sensor-train: {r.labelled_assets} labelled assets ({r.label_fraction:.0%}), {origin}",
        f"  CNN       test RMSE {r.rul.rmse:.2f}  MAE {r.rul.mae:.2f}  PHM08 {r.rul.extra.get('phm08', float('nan')):.1f}"
        + (f"  PR-AUC {r.failure.pr_auc:.3f}  F1 {r.failure.f1:.3f}" if r.failure else ""),
    ]
    if r.baseline_rul:
        lines.append(
            f"  baseline  test RMSE {r.baseline_rul.rmse:.2f}  MAE {r.baseline_rul.mae:.2f}  PHM08 {r.baseline_rul.extra.get('phm08', float('nan')):.1f}"
            + (f"  PR-AUC {r.baseline_failure.pr_auc:.3f}" if r.baseline_failure else "")
        )
    lines += [
        (
            f"  alerts: mean lead time {r.alerts.get('mean_lead_time', float('nan')):.1f} steps, "
            f"{r.alerts.get('alerted_share', float('nan')):.0%} of failed test assets alerted in time"
        ),
        f"  winner: {r.winner}; registered {r.model.spec}: {r.promotion.reason}",
        f"  report: {r.report_dir}/report.md  ({r.seconds:.0f} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.sensor {pretrain,train,score}``."""
    parser = argparse.ArgumentParser(prog="python -m flows.sensor", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    pre = sub.add_parser("pretrain", help="self-supervised masked-reconstruction pre-training of the encoder",
                         description=sensor_pretrain.description)
    _source_args(pre)
    pre.add_argument("--pretrain-epochs", type=int, default=PretrainConfig().max_epochs, help="default %(default)s")
    pre.add_argument("--encoder-name", default="sensor-encoder", help="registry name (default %(default)s)")
    pre.add_argument("--fresh", action="store_true", help="retrain even if this run's checkpoints exist")

    t = sub.add_parser("train", help="fine-tune (or train from scratch) + evaluate + register", description=sensor_train.description)
    _source_args(t)
    f = FinetuneConfig()
    t.add_argument("--label-fraction", type=float, default=f.label_fraction, help="share of training assets labelled (default %(default)s)")
    t.add_argument("--no-pretrain", action="store_true", help="train from scratch instead of fine-tuning the pre-trained encoder")
    t.add_argument("--max-epochs", type=int, default=f.max_epochs, help="default %(default)s")
    t.add_argument("--pretrain-epochs", type=int, default=PretrainConfig().max_epochs, help="if pre-training is needed (default %(default)s)")
    t.add_argument("--encoder-name", default="sensor-encoder", help="registry name of the encoder (default %(default)s)")
    t.add_argument("--model-name", default="sensor-rul", help="registry name (default %(default)s)")
    t.add_argument("--no-baseline", action="store_true", help="skip the gradient-boosting baseline")
    t.add_argument("--fresh", action="store_true", help="retrain even if this run's checkpoints exist")
    t.add_argument("--strict", action="store_true", help="fail (QualityGateError) if the new version does not beat the champion")

    s = sub.add_parser("score", help="score the latest window of each asset with the champion", description=sensor_score.description)
    _source_args(s, windows=False)
    s.add_argument("--model", default="sensor-rul", help="NAME[:VERSION] (default: the champion of %(default)s)")
    s.add_argument("--output", metavar="FILE", help="Parquet output (default: <home>/scores/<input>-<model>-v<version>.parquet)")
    s.add_argument("--csv", action="store_true", help="also write a CSV beside the Parquet")
    s.add_argument("--threshold", type=float, help="alert when P(failure) >= this (default: the model's)")

    b = sub.add_parser("batch", help="score every new readings file of an inbox folder/glob (ledger + quarantine)",
                       description=sensor_batch_score.description)
    b.add_argument("--inbox", metavar="DIR|GLOB", help="folder or glob of long-format CSV/Parquet files (default: <home>/inbox/sensor)")
    b.add_argument("--model", default="sensor-rul", help="NAME[:VERSION] (default: the champion of %(default)s)")
    b.add_argument("--columns", metavar="MAP", help="column mapping canonical=SOURCE,..., e.g. asset_id=machine,timestamp=ts")
    b.add_argument("--threshold", type=float, help="alert when P(failure) >= this (default: the model's)")
    b.add_argument("--output-dir", metavar="DIR", help="where score files go (default: <home>/scores/sensor-batch)")
    b.add_argument("--csv", action="store_true", help="also write a CSV beside each Parquet")
    b.add_argument("--settle-seconds", type=float, default=30.0,
                   help="skip files modified in the last N seconds (still being copied; default %(default)s)")
    add_common(b)

    args = parser.parse_args(argv)
    if args.command == "batch":
        return run_command(
            lambda: sensor_batch_score(
                inbox=args.inbox, model=args.model, columns=parse_columns(args.columns), threshold=args.threshold,
                output_dir=args.output_dir, csv=args.csv, settle_seconds=args.settle_seconds,
            ),
            as_json=args.json,
            summary=lambda r: inbox_summary("sensor-batch-score", r, rows="assets", flagged="alerts"),
        )
    try:
        source, config = _source_from(args), _config_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.command == "pretrain":
        return run_command(
            lambda: sensor_pretrain(source, config, fresh=args.fresh),
            as_json=args.json,
            summary=lambda r: (
                f"sensor-pretrain: {r.windows['train']} windows, {len(r.channels)} channels, val masked MSE "
                f"{r.train.best_score:.4f}; registered {r.model.spec}: {r.promotion.reason}\n  {r.bad_readings.summary()}"
            ),
        )
    if args.command == "train":
        return run_command(
            lambda: sensor_train(source, config, fresh=args.fresh, strict=args.strict),
            as_json=args.json,
            summary=_train_summary,
        )
    if args.command == "score":
        return run_command(
            lambda: sensor_score(source, model=args.model, output=args.output, csv=args.csv, threshold=args.threshold, config=config),
            as_json=args.json,
            summary=lambda r: f"sensor-score: {r.assets_scored} assets scored with {r.model}, {r.alerts} alerts "
            f"(P >= {r.threshold:.3g}) -> {r.output}" + (f" and {r.csv_output}" if r.csv_output else ""),
        )
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
