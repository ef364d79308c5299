"""``sensor-forecast-train`` and ``sensor-forecast``: each asset's sensors H steps ahead, with
prediction intervals and alerts on alarm limits (statsforecast models over the aligned grid)."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from prefect import flow, task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict

from flows.sensor import steps as st
from infra.home import home_layout
from infra.registry import ModelRef, ModelRegistry, PromotionDecision, parse_model_spec
from infra.tables import write_table
from solutions.sensor import forecast as F
from solutions.sensor import forecast_evaluate as FE
from solutions.sensor import forecast_report as FR
from solutions.sensor import schema as S
from solutions.sensor.config import SensorConfig, SensorSource
from solutions.sensor.forecast_config import KIND, ForecastConfig, LimitAlert
from solutions.sensor.schema import BadReadingReport
from solutions.sensor.scoring import default_scores_path
from tasks.data import DatasetRef
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.register import register_model_task, render_promotion


class SensorForecastTrainResult(BaseModel):
    """A forecaster chosen, judged on held-out assets and registered."""

    model_config = ConfigDict(frozen=True)

    dataset: DatasetRef
    bad_readings: BadReadingReport
    assets: dict[str, int]
    methods: dict[str, str]
    skipped: dict[str, str]
    metrics: dict[str, float]
    per_horizon: list[dict[str, float]]
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str
    seconds: float


class SensorForecastResult(BaseModel):
    """Forecasts of every asset's sensors, and the alarm limits they cross."""

    model_config = ConfigDict(frozen=True)

    model: str
    input: str
    assets: int
    sensors: int
    horizon: int
    level: int
    rows: int
    alerts: list[LimitAlert]
    output: str
    alerts_output: str
    csv_output: str | None
    plot: str | None
    bad_readings: BadReadingReport


@task(name="split-assets", cache_policy=NONE)
def split_step(grid_ref: DatasetRef, config: SensorConfig) -> dict[str, list[str]]:
    """Assets to choose the methods on (train + validation) and to judge them on (test), as the
    other sensor flows split them."""
    from solutions.sensor.pipeline import split_assets

    splits = split_assets(grid_ref.read(), config.split)
    return {"train": splits["train"] + splits["val"], "test": splits["test"]}


@task(name="evaluate-forecasters", cache_policy=NONE)
def evaluate_step(grid_ref: DatasetRef, splits: dict[str, list[str]], forecast: ForecastConfig,
                  config: SensorConfig) -> FE.ForecastEvaluation:
    """Choose each sensor's method on the training assets; score every candidate on the held-out ones."""
    return FE.evaluate_forecasters(grid_ref.read(), splits["train"], splits["test"], forecast, config.align.op_prefix)


@task(name="rescore-champion", cache_policy=NONE)
def champion_value_step(name: str, grid_ref: DatasetRef, splits: dict[str, list[str]]) -> float | None:
    """The champion forecaster's test MASE on this run's held-out assets (None: no comparable champion)."""
    registry = ModelRegistry()
    champion = registry.champion(name) if name in registry.models() else None
    if champion is None or champion.kind != KIND:
        return None
    return FE.rescore(F.Forecaster.from_params(champion.params), grid_ref.read(), splits["test"])


@task(name="forecast-assets", cache_policy=NONE)
def forecast_step(forecaster: F.Forecaster, grid_ref: DatasetRef) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every asset's sensors H steps ahead, and the first limit crossing of each (asset, sensor)."""
    table = F.forecast_grid(forecaster, grid_ref.read())
    return table, F.limit_alerts(table, forecaster.upper_limits, forecaster.lower_limits, forecaster.alert_on)


@task(name="plot-forecasts", cache_policy=NONE)
def plot_step(grid_ref: DatasetRef, table: pd.DataFrame, alerts: pd.DataFrame, forecaster: F.Forecaster,
              count: int, path: Path) -> Path | None:
    """History, forecast and interval of a few assets (those with alerts first)."""
    if count == 0 or table.empty:
        return None
    assets = FR.plot_assets(table, alerts, count)
    grid = grid_ref.read()
    return FR.plot_forecasts(grid.loc[grid[S.ASSET].astype(str).isin(assets)], table, assets,
                             FR.plot_sensors(forecaster, alerts), path, forecaster)


@flow(name="sensor-forecast-train", log_prints=True)
def sensor_forecast_train(
    source: SensorSource = SensorSource(),  # noqa: B008 - a frozen typed default renders a UI form
    forecast: ForecastConfig = ForecastConfig(),  # noqa: B008 - a frozen typed default renders a UI form
    config: SensorConfig = SensorConfig(),  # noqa: B008 - a frozen typed default renders a UI form
    strict: bool = False,
) -> SensorForecastTrainResult:
    """Choose each sensor's forecasting model (statsforecast: naive, seasonal naive, AutoETS,
    AutoARIMA...) by its MASE on the training assets' last H steps, judge the choice against the
    naive and seasonal-naive baselines on held-out assets (MASE and interval coverage per horizon
    step), register it and promote it if its test MASE beats the champion's on the same assets.

    Args:
        source: the input data (default: the seeded synthetic fleet).
        forecast: horizon, interval, candidate models and alarm limits.
        config: settings of the sensor vertical (the grid and the asset split).
        strict: fail (QualityGateError) if the new version does not beat the champion.
    """
    started = time.perf_counter()
    grid_ref, bad = st.obtain_grid(source, config)
    splits = split_step(grid_ref, config)
    ev = evaluate_step(grid_ref, splits, forecast, config)
    champion = champion_value_step(forecast.model_name, grid_ref, splits)
    metrics = ev.metrics()
    registration = register_model_task(
        forecast.model_name, None, kind=KIND,
        params={**ev.forecaster.to_params(), "split": config.split.model_dump(), "skipped": ev.skipped},
        metrics=metrics, primary_metric=FE.PRIMARY_METRIC, higher_is_better=False, data_hash=grid_ref.content_hash,
        champion_value=champion, strict=strict,
    )
    out_dir = home_layout().new_report("sensor-forecast-train")
    markdown = (FR.render_evaluation(ev, f"sensor-forecast-train: {source.describe()}") + "\n"
                + render_promotion(registration.decision))
    (out_dir / "report.md").write_text(markdown)
    publish_eval_report_task(markdown, key=artifact_key("sensor-forecast-train-report"),
                             description="Forecast MASE and interval coverage per horizon vs the baselines")
    return SensorForecastTrainResult(
        dataset=grid_ref, bad_readings=bad, assets={k: len(v) for k, v in splits.items()},
        methods=ev.forecaster.methods, skipped=ev.skipped, metrics=metrics,
        per_horizon=ev.horizon_table().to_dict("records"), model=registration.model,
        promotion=registration.decision, report_dir=str(out_dir), seconds=time.perf_counter() - started,
    )


def _forecaster_ref(model: str, source: SensorSource, forecast: ForecastConfig, config: SensorConfig) -> ModelRef:
    """The version to forecast with; a bare name with nothing registered trains one first."""
    name, _ = parse_model_spec(model)
    registry = ModelRegistry()
    if name == model and name not in registry.models():
        print(f"no forecaster {name} registered yet: training one first (sensor-forecast-train)")
        return sensor_forecast_train(source, forecast.model_copy(update={"model_name": name}), config).model
    ref = registry.resolve(model)
    if ref.kind != KIND:
        raise ValueError(f"{ref.spec} is a {ref.kind} model, not a forecaster; train one with "
                         "`python -m flows.sensor forecast-train` and pass its name")
    return ref


@flow(name="sensor-forecast", log_prints=True)
def sensor_forecast(
    source: SensorSource = SensorSource(),  # noqa: B008 - a frozen typed default renders a UI form
    model: str = "sensor-forecast",
    forecast: ForecastConfig = ForecastConfig(),  # noqa: B008 - a frozen typed default renders a UI form
    output: str | None = None,
    csv: bool = False,
    config: SensorConfig = SensorConfig(),  # noqa: B008 - a frozen typed default renders a UI form
) -> SensorForecastResult:
    """Forecast the next H steps of every sensor of every asset with the registered forecaster
    (its champion, or a named version; one is trained first when none is registered), with
    prediction intervals, and alert where a forecast crosses an alarm limit within the horizon.
    Writes the forecasts and the alerts (Parquet) and a plot of a few assets.

    Args:
        source: the input data (default: the seeded synthetic fleet).
        model: NAME[:VERSION|@alias] of a registered forecaster; a bare NAME forecasts with its champion.
        forecast: alarm limits and the plot (given limits replace the version's); horizon, interval and
            models are the registered version's (they matter when one is trained first).
        output: Parquet output (default: <home>/scores/<input>-<model>-v<version>.parquet).
        csv: also write CSVs beside the Parquet files.
        config: settings of the sensor vertical (the grid).
    """
    ref = _forecaster_ref(model, source, forecast, config)
    forecaster = F.Forecaster.from_params(ref.params).with_limits(forecast.upper_limits, forecast.lower_limits,
                                                                  forecast.alert_on)
    grid_ref, bad = st.obtain_grid(source, config)
    table, alerts = forecast_step(forecaster, grid_ref)
    target = Path(output).expanduser() if output else default_scores_path(home_layout().scores(), source, ref)
    csv_path = write_table(table.assign(model=ref.name, model_version=ref.version), target, csv)
    alerts_path = target.with_name(f"{target.stem}-alerts.parquet")
    write_table(alerts.assign(model=ref.name, model_version=ref.version), alerts_path, csv)
    plot = plot_step(grid_ref, table, alerts, forecaster, forecast.plot_assets, target.with_suffix(".png"))
    typed = F.alert_models(alerts)
    publish_eval_report_task(
        f"## sensor-forecast with {ref.spec}\n\n{table[S.ASSET].nunique()} assets, {len(forecaster.sensors)} sensors, "
        f"{forecaster.horizon} steps ahead ({forecaster.level}% intervals) -> `{target}`\n\n"
        f"### Alerts ({len(typed)})\n\n{FR.render_alerts(alerts)}\n" + (f"![forecasts]({plot.as_posix()})\n" if plot else ""),
        key=artifact_key("sensor-forecast-summary"), description="Sensor forecasts and limit alerts")
    return SensorForecastResult(
        model=ref.spec, input=source.describe(), assets=int(table[S.ASSET].nunique()),
        sensors=len(forecaster.sensors), horizon=forecaster.horizon, level=forecaster.level, rows=len(table),
        alerts=typed, output=str(target), alerts_output=str(alerts_path),
        csv_output=str(csv_path) if csv_path else None, plot=str(plot) if plot else None, bad_readings=bad,
    )
