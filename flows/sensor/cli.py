"""Sensor fault prediction commands: pretrain, train, score, batch scoring, monitor, evidence, promote, approve;
sensor forecasting: forecast-train, forecast.

Input is the seeded synthetic fleet by default, a long-format readings file (``--data``,
``--events``, ``--columns``) or the NASA C-MAPSS files (``--cmapss-dir DIR --subset FD001``).
Flags, defaults and help come from the flows' parameters (:mod:`flows.cli`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.cli import Command, approval_commands, champion_commands, evidence_command, make_main
from infra.registry import ModelRegistry, parse_model_spec

if TYPE_CHECKING:
    from flows.sensor.forecast import SensorForecastResult, SensorForecastTrainResult
    from flows.sensor.results import (
        SensorBatchScoreResult,
        SensorMonitorResult,
        SensorPretrainResult,
        SensorScoreResult,
        SensorTrainResult,
    )
    from tasks.reproduce import ReproduceResult

#: The flows, by entrypoint: imported only when a command runs (see flows/cli.py).
PRETRAIN = "flows.sensor.pretrain:sensor_pretrain"
TRAIN = "flows.sensor.train:sensor_train"
SCORE = "flows.sensor.score:sensor_score"
BATCH = "flows.sensor.batch:sensor_batch_score"
MONITOR = "flows.sensor.monitor:sensor_monitor"
REPRODUCE = "flows.sensor.reproduce:sensor_reproduce"
FORECAST_TRAIN = "flows.sensor.forecast:sensor_forecast_train"
FORECAST = "flows.sensor.forecast:sensor_forecast"

# flag names where a field name alone would collide or be unclear
_FLEET = {"config.fleet.seed": "seed"}
_PRETRAIN = {
    "config.window.length": "window",
    "config.window.stride": "window-stride",
    "config.pretrain.lr": "pretrain-lr",
    "config.pretrain.batch_size": "pretrain-batch-size",
    "config.pretrain.max_epochs": "pretrain-epochs",
    "config.pretrain.patience": "pretrain-patience",
    "config.pretrain.stride": "pretrain-stride",
    "config.pretrain.seed": "pretrain-seed",
    "config.split.seed": "split-seed",
    "config.encoder_name": "encoder",
}
_TRAIN = {
    "source.origin": "source",
    "config.finetune.pretrained": "no-pretrain",
    "config.finetune.mode": "finetune-mode",
    "config.finetune.seed": "finetune-seed",
    "config.model_name": "model",
}
#: not offered on the command line: per-sensor ranges are a mapping of pairs (set them in the UI)
_RANGES = "config.align.valid_range"
#: forecasting: the split is the other flows' (its seed named as theirs); the RUL training settings are not used
_FORECASTING = {"config.split.seed": "split-seed", "forecast.model_name": "model"}
_NOT_FORECASTING = ("config.window", "config.model", "config.pretrain", "config.finetune", "config.baseline",
                    "config.extra_archs", "config.encoder_name", "config.model_name")
#: The input files, shown in the short --help (C-MAPSS: --cmapss-dir and --subset).
_SOURCE = ("source.data", "source.events", "source.columns", "source.cmapss_dir", "source.subset")
_TRAINING = ("config.window", "config.model", "config.pretrain", "config.finetune", "config.split",
             "config.baseline", "config.encoder_name", "config.model_name")


# ------------------------------------------------------------------------------------
# pre-flight checks (before any flow run starts)


def _check_source(kwargs: dict[str, Any]) -> None:
    """Files or folder exist; a readings/events file's header (no rows read) has the mapped columns."""
    from solutions.sensor.config import SensorSource
    from solutions.sensor.data import check_source_files

    check_source_files(kwargs.get("source", SensorSource()))


def _check_threshold(kwargs: dict[str, Any]) -> None:
    threshold = kwargs.get("threshold")
    if threshold is not None and not 0 < threshold < 1:
        raise ValueError(f"--threshold must be between 0 and 1 (exclusive), got {threshold}")


def _check_score(kwargs: dict[str, Any]) -> None:
    _check_source(kwargs)
    _check_threshold(kwargs)


def _check_inbox_reading(kwargs: dict[str, Any], location: str) -> None:
    """The encoding and column mapping of an inbox job, and its ``location`` (a folder, a file or a glob)."""
    from infra.tables import check_encoding
    from solutions.sensor.schema import ColumnMapping

    if kwargs.get("encoding"):
        try:
            check_encoding(kwargs["encoding"])
        except ValueError as exc:
            raise ValueError(f"--encoding: {exc}") from None
    ColumnMapping(dict(kwargs.get("columns") or {}))
    where = kwargs.get(location)
    if where and not any(ch in where for ch in "*?[") and not Path(where).expanduser().exists():
        raise ValueError(f"--{location}: {where} does not exist (give a folder, a file or a glob)")


def _check_batch(kwargs: dict[str, Any]) -> None:
    _check_threshold(kwargs)
    _check_inbox_reading(kwargs, "inbox")
    if kwargs.get("settle_seconds", 0.0) < 0:
        raise ValueError("--settle-seconds must be >= 0")


def _check_monitor(kwargs: dict[str, Any]) -> None:
    _check_inbox_reading(kwargs, "failures")


def _check_reproduce(kwargs: dict[str, Any]) -> None:
    if kwargs.get("tolerance", 0.0) < 0:
        raise ValueError(f"--tolerance: {kwargs['tolerance']} is negative")
    spec = kwargs.get("model", "sensor-rul")
    try:
        parse_model_spec(spec)
    except ValueError as exc:
        raise ValueError(f"--model: {exc}") from None
    ModelRegistry().resolve(spec)  # RegistryError names the registered models


# ------------------------------------------------------------------------------------
# summaries


def _pretrain_summary(r: SensorPretrainResult) -> str:
    best = f"{r.train.best_score:.4f}" if r.train.best_score is not None else "n/a"
    return (f"sensor-pretrain: {r.windows['train']} windows, {len(r.channels)} channels, val masked MSE {best}; "
            f"registered {r.model.spec}: {r.promotion.reason}\n  {r.bad_readings.summary()}")


def _train_summary(r: SensorTrainResult) -> str:
    nan = float("nan")
    origin = f"fine-tuned from {r.pretrained_from}" if r.pretrained_from else "from scratch"
    lines = [
        f"sensor-train: {r.labelled_assets} labelled assets ({r.label_fraction:.0%}), {origin}",
        f"  CNN       test RMSE {r.rul.rmse:.2f}  MAE {r.rul.mae:.2f}  PHM08 {r.rul.extra.get('phm08', nan):.1f}"
        + (f"  PR-AUC {r.failure.pr_auc:.3f}  F1 {r.failure.f1:.3f}" if r.failure else ""),
    ]
    if r.baseline_rul:
        b = r.baseline_rul
        lines.append(f"  baseline  test RMSE {b.rmse:.2f}  MAE {b.mae:.2f}  PHM08 {b.extra.get('phm08', nan):.1f}"
                     + (f"  PR-AUC {r.baseline_failure.pr_auc:.3f}" if r.baseline_failure else ""))
    lines += [
        (f"  alerts: mean lead time {r.alerts.get('mean_lead_time', nan):.1f} steps, "
         f"{r.alerts.get('alerted_share', nan):.0%} of failed test assets alerted in time"),
        _registered_figures(r),
        f"  promotion: {r.promotion.reason}",
        f"  report: {r.report_dir}/report.md  ({r.seconds:.0f} s)",
    ]
    return "\n".join(lines)


def _registered_figures(r: SensorTrainResult) -> str:
    """The registered winner's own test figures (a GBM or an ensemble has no line above)."""
    m, nan = r.model.metrics, float("nan")
    failure = (f"  PR-AUC {m['test/pr_auc']:.3f}" if "test/pr_auc" in m else "") + (
        f"  F1 {m['test/f1']:.3f}" if "test/f1" in m else "")
    return (f"  registered {r.model.spec} ({r.winner})  test RMSE {m.get('test/rmse', nan):.2f}  "
            f"MAE {m.get('test/mae', nan):.2f}  PHM08 {m.get('test/phm08', nan):.1f}{failure}")


def _score_summary(r: SensorScoreResult) -> str:
    return (f"sensor-score: {r.assets_scored} assets scored with {r.model}, {r.alerts} alerts "
            f"(P >= {r.threshold:.3g}) -> {r.output}" + (f" and {r.csv_output}" if r.csv_output else "")
            + f"\n  {r.bad_readings.summary()}")


def _batch_summary(r: SensorBatchScoreResult) -> str:
    from tasks.ledger import inbox_summary

    lines = [inbox_summary("sensor-batch-score", r, rows="assets", flagged="alerts")]
    lines += [f"  {report.summary()}" for report in r.bad_readings.values()]
    return "\n".join(lines)


def _monitor_summary(r: SensorMonitorResult) -> str:
    acc = r.accumulated
    lines = [(f"sensor-monitor: {r.failures_files} failures file(s), {r.failures_rows} event(s), "
              f"{len(r.quarantined)} quarantined; {r.judged} prediction(s) of failed assets judged"),
             (f"  accumulated: {acc.days} day(s) of readings ({acc.first_day} to {acc.last_day}), "
              f"{acc.failures} failed asset(s), {acc.files_added} scored file(s) added")]
    lines += [f"  {row['model']}:{row['model_version']}  MAE {row['mae']:.2f}  RMSE {row['rmse']:.2f}  "
              f"bias {row['bias']:+.2f}  within {row['within_share']:.0%}  ({row['judged']} judged)" for row in r.rul_error]
    lines.append(f"  report: {r.report_dir}/report.md")
    return "\n".join(lines)


def _forecast_train_summary(r: SensorForecastTrainResult) -> str:
    m = r.metrics
    nan = float("nan")
    return "\n".join([
        f"sensor-forecast-train: {len(r.methods)} sensors, {r.assets['train']} training / {r.assets['test']} held-out assets",
        (f"  test MASE {m.get('test/mase', nan):.3f} (naive {m.get('test/mase_naive', nan):.3f}, seasonal naive "
         f"{m.get('test/mase_seasonal_naive', nan):.3f}), interval coverage {m.get('test/coverage', nan):.0%}"),
        f"  methods: {', '.join(f'{s}={k}' for s, k in r.methods.items())}",
        f"  registered {r.model.spec}: {r.promotion.reason}",
        f"  report: {r.report_dir}/report.md  ({r.seconds:.0f} s)",
    ])


def _forecast_summary(r: SensorForecastResult) -> str:
    lines = [(f"sensor-forecast: {r.assets} assets x {r.sensors} sensors, {r.horizon} steps ahead ({r.level}% intervals) "
             f"with {r.model} -> {r.output}"), f"  alerts: {len(r.alerts)} -> {r.alerts_output}"]
    lines += [f"    {a.asset_id} {a.sensor}: {a.limit_kind} limit {a.limit:g} crossed in {a.steps_ahead} step(s) "
              f"(step {a.step}, {a.value:.4g})" for a in r.alerts[:10]]
    if len(r.alerts) > 10:
        lines.append(f"    ... {len(r.alerts) - 10} more")
    if r.plot:
        lines.append(f"  plot: {r.plot}")
    return "\n".join(lines)


def _check_forecast(kwargs: dict[str, Any]) -> None:
    """The source, and a --model that is registered is a forecaster (a bare name not registered yet is
    trained first)."""
    from solutions.sensor.forecast_config import KIND

    _check_source(kwargs)
    spec = kwargs.get("model", "sensor-forecast")
    try:
        name, _ = parse_model_spec(spec)
    except ValueError as exc:
        raise ValueError(f"--model: {exc}") from None
    registry = ModelRegistry()
    if name != spec or name in registry.models():
        ref = registry.resolve(spec)  # RegistryError names the registered models
        if ref.kind != KIND:
            raise ValueError(f"--model: {ref.spec} is a {ref.kind} model, not a forecaster; train one with "
                             "`python -m flows.sensor forecast-train`")


def _reproduce_summary(r: ReproduceResult) -> str:
    from tasks.reproduce import reproduce_summary

    return reproduce_summary(r)


def _reproduce_exit_code(r: ReproduceResult) -> int:
    from tasks.reproduce import reproduce_exit_code

    return reproduce_exit_code(r)


COMMANDS = [
    Command(
        "pretrain", PRETRAIN, _pretrain_summary,
        help="self-supervised masked-reconstruction pre-training of the encoder",
        flags={**_FLEET, **_PRETRAIN},
        hidden={"config.finetune", "config.baseline", "config.model_name", _RANGES},
        common=(*_SOURCE, "config.pretrain.max_epochs", "config.encoder_name", "fresh"),
        check=_check_source,
    ),
    Command(
        "train", TRAIN, _train_summary,
        help="fine-tune (or train from scratch) + evaluate beside a baseline + register",
        flags={**_FLEET, **_PRETRAIN, **_TRAIN},
        hidden={_RANGES},
        common=(*_SOURCE, "config.finetune.label_fraction", "config.finetune.max_epochs", "fresh"),
        check=_check_source,
    ),
    Command(
        "score", SCORE, _score_summary,
        help="score the latest window of each asset with the champion (or --model)",
        flags=_FLEET,
        hidden={*_TRAINING, _RANGES},
        common=(*_SOURCE, "output", "csv", "threshold"),
        check=_check_score,
    ),
    Command(
        "batch", BATCH, _batch_summary,
        help="score every new readings file of an inbox folder/glob (ledger + quarantine)",
        hidden={*_TRAINING, "config.fleet", _RANGES},
        check=_check_batch,
    ),
    Command(
        "monitor", MONITOR, _monitor_summary,
        help="failure events -> realised RUL error per model version; accumulate training data",
        hidden={"align.valid_range", "align.fast_sensors", "align.ffill_limit", "align.op_prefix"},
        check=_check_monitor,
    ),
    evidence_command("flows.sensor.evidence:sensor_evidence",
                     "served RULs per version (champion, challenger) judged by later failures; recommend (--promote)"),
    *champion_commands("flows.sensor.promote:sensor_promote", "flows.sensor.promote:sensor_rollback"),
    *approval_commands(),
    Command(
        "forecast-train", FORECAST_TRAIN, _forecast_train_summary,
        help="choose each sensor's forecasting model (statsforecast), judge it vs naive on held-out assets, register",
        flags={**_FLEET, **_FORECASTING},
        hidden={*_NOT_FORECASTING, "forecast.plot_assets", _RANGES},
        common=(*_SOURCE, "forecast.horizon", "forecast.level", "forecast.sensors", "strict"),
        check=_check_source,
    ),
    Command(
        "forecast", FORECAST, _forecast_summary,
        help="forecast every asset's sensors H steps ahead with intervals; alert on limits crossed",
        flags={**_FLEET, "config.split.seed": "split-seed"},
        hidden={*_NOT_FORECASTING, "forecast.model_name", _RANGES},
        common=(*_SOURCE, "forecast.horizon", "forecast.level", "output"),
        check=_check_forecast,
    ),
    Command(
        "reproduce", REPRODUCE, _reproduce_summary,
        help="re-train a registered version from its lineage; exit 0 when its metrics hold",
        check=_check_reproduce, exit_code=_reproduce_exit_code,
    ),
]

main = make_main("python -m flows.sensor", (__doc__ or "").splitlines()[0], COMMANDS)
