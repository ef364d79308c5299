"""``POST /v1/sensor/predict``: the sensor champion's RUL, failure probability and alert for
the latest window of each asset in a request.

A request carries recent readings of one or more assets, in long format (``readings``:
asset_id, timestamp, sensor, value, or source names with ``columns``) or as the aligned grid
(``grid``). They are aligned and normalised by the batch path's own functions
(:mod:`solutions.sensor.online`), so an asset scores as ``sensor score`` scores it in a file.
Readings covering the model's window plus the forward-fill limit and one step (e.g. the last 34
hours for a 30-step window of hourly steps) give the same answer as the asset's whole history.
Concurrent requests share one model call (:class:`~infra.serving.batching.DynamicBatcher`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import pandas as pd
from fastapi import APIRouter, Body, Depends, HTTPException, Request
from pydantic import BaseModel, Field, model_validator

from infra.errors import DataValidationError
from infra.registry import ModelRef
from infra.serving.audit import record_audit
from infra.serving.auth import Principal, require_scope
from infra.serving.batching import DynamicBatcher
from infra.serving.challenger import CHALLENGER_ROLE, CHAMPION_ROLE, ScoreRecord
from infra.serving.quotas import check_rows
from infra.serving.runtime import Services, Vertical
from solutions.sensor import schema as S
from solutions.sensor.config import AlignConfig
from solutions.sensor.monitoring import SCORED_T

if TYPE_CHECKING:  # the model code (torch, Lightning) is imported when a model loads, not at startup
    from solutions.sensor.online import OnlineSensorModel

SCOPE = "sensor:predict"
_SEP = "\x1f"  # request number and asset id, while requests share one model call


def _reading(minute: int, sensor: str, value: float) -> dict[str, Any]:
    return {"asset_id": "pump-7", "timestamp": f"2025-03-01T{10 + minute // 60:02d}:{minute % 60:02d}:00",
            "sensor": sensor, "value": value}


#: Two hours of one asset with the sensors of the synthetic fleet (``sensor train``'s default data):
#: each slow sensor once an hour (pressure once: carried forward), each vibration channel twice an
#: hour (2 readings per grid step make a fast sensor: RMS, peak and kurtosis per step).
_EXAMPLE = {"readings": [
    *(_reading(m, s, v) for m in (0, 60) for s, v in (("op_load", 0.6), ("op_speed", 1802.0), ("temperature", 103.5),
                                                         ("flow", 129.1), ("current", 22.3))),
    _reading(0, "pressure", 6.7),
    *(_reading(m, s, v) for m in (5, 35, 65, 95) for s, v in (("vib_radial", 0.91 if m % 60 == 5 else -0.87),
                                                                 ("vib_axial", 0.24 if m % 60 == 5 else -0.31))),
]}
_CMAPSS_LINES = (("1 1 -0.0007 -0.0004 100.0 518.67 641.82 1589.70 1400.60 14.62 21.61 554.36 2388.06 9046.19 1.30 47.47 "
                 "521.66 2388.02 8138.62 8.4195 0.03 392 2388 100.00 39.06 23.4190"),
                 ("1 2 0.0019 -0.0003 100.0 518.67 642.15 1591.82 1403.14 14.62 21.61 553.75 2388.04 9044.07 1.30 47.49 "
                 "522.28 2388.07 8131.49 8.4318 0.03 392 2388 100.00 39.00 23.4236"))


def _cmapss_row(line: str) -> dict[str, Any]:
    unit, cycle, *values = line.split()
    names = [*(f"op_setting_{i}" for i in (1, 2, 3)), *(f"sensor_{i}" for i in range(1, 22))]
    return {"asset_id": f"engine-{unit}", "step": int(cycle) - 1, **dict(zip(names, map(float, values)))}


#: What /docs offers (and the fuzz test sends): the readings above, and two cycles of a C-MAPSS
#: engine as grid rows (for a champion trained with --cmapss-dir; the synthetic one answers 422).
OPENAPI_EXAMPLES = {
    "readings": {"summary": "Long-format readings (the default synthetic-fleet champion)", "value": _EXAMPLE},
    "cmapss": {"summary": "C-MAPSS engine cycles as grid rows, step = cycle - 1 (a C-MAPSS champion)",
               "value": {"grid": [_cmapss_row(line) for line in _CMAPSS_LINES]}},
}
_READING_SCHEMA = {"type": "object", "additionalProperties": True, "properties": {
    "asset_id": {"type": "string"}, "timestamp": {"anyOf": [{"type": "string", "format": "date-time"},
                                                            {"type": "number"}]},
    "sensor": {"type": "string"}, "value": {"anyOf": [{"type": "number"}, {"type": "null"}]}}}
_GRID_ROW_SCHEMA = {"type": "object", "additionalProperties": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                    "required": ["asset_id", "step"],
                    "properties": {"asset_id": {"type": "string"}, "step": {"type": "integer"}}}


class SensorPredictRequest(BaseModel):
    """Recent readings of one or more assets: ``readings`` (long format) or ``grid`` (aligned)."""

    readings: list[dict[str, Any]] | None = Field(
        default=None, json_schema_extra={"items": _READING_SCHEMA},
        description="Long format: one object per reading (asset_id, timestamp as ISO 8601 or seconds, sensor, "
        "value), aligned on the model's grid (3600 s steps); every sensor the model was trained on, over at least "
        "2 steps (a history shorter than the window is left-padded with its first step).")
    grid: list[dict[str, Any]] | None = Field(
        default=None, json_schema_extra={"items": _GRID_ROW_SCHEMA},
        description="Aligned grid: one object per (asset_id, step) with the model's feature columns (and gap__ "
        "flags); C-MAPSS engines send one row per cycle, step = cycle - 1, op_setting_1..3 and sensor_1..21.")
    columns: dict[str, str] | None = Field(
        default=None, description="Column mapping canonical -> source name for long-format readings, e.g. "
        '{"asset_id": "machine", "sensor": "probe"}.')

    @model_validator(mode="after")
    def _one_format(self) -> SensorPredictRequest:
        if (self.readings is None) == (self.grid is None):
            raise ValueError("send exactly one of 'readings' (long format) or 'grid' (aligned grid)")
        return self

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.readings if self.readings is not None else (self.grid or [])


class AssetPrediction(BaseModel):
    """The latest window of one asset."""

    asset_id: str
    step: int = Field(description="Grid step the window ends at.")
    predicted_rul: float = Field(description="Remaining useful life, in grid steps.")
    failure_probability: float = Field(description="P(failure within the model's horizon).")
    alert: bool = Field(description="failure_probability >= threshold.")
    threshold: float
    model: str
    model_version: int = Field(description="The version that decided this asset: the champion, or in split mode "
                               "the challenger for its share of assets.")


class SensorPredictResponse(BaseModel):
    """One prediction per asset (sorted by asset id); each names the version that decided it."""

    model: str
    model_version: int = Field(description="The champion's version.")
    predictions: list[AssetPrediction]


def load_online_model(ref: ModelRef, services: Services) -> OnlineSensorModel:
    """A registered sensor version (or a compressed variant) kept loaded for online prediction."""
    from infra.registry import KIND_SKLEARN
    from solutions.sensor.candidates import load_baseline
    from solutions.sensor.model import build_module
    from solutions.sensor.online import OnlineSensorModel
    from solutions.sensor.pipeline import predictor_from_params
    from solutions.sensor.scoring import is_variant
    from tasks.compress import load_variant

    baseline = load_baseline(ref)  # a GBM or ensemble champion (skops, allow-listed types)
    if ref.kind == KIND_SKLEARN:
        return OnlineSensorModel(ref=ref, baseline=baseline)
    if is_variant(ref):
        return OnlineSensorModel(ref=ref, variant=load_variant(ref, services.registry, build_module), baseline=baseline)
    net, _, _ = predictor_from_params(ref.params, services.registry.load_state_dict(ref))
    return OnlineSensorModel(ref=ref, net=net, baseline=baseline)


@dataclass(frozen=True)
class _Predicted:
    """One request's predictions: the champion's table, the challenger's (its version and table,
    where it predicted), and per champion row whether the challenger answers that asset (split)."""

    table: pd.DataFrame
    challenger: ModelRef | None = None
    challenger_table: pd.DataFrame | None = None
    by_challenger: np.ndarray | None = None


_Item = SensorPredictRequest
_Result = tuple[ModelRef, "_Predicted | Exception"]


def _request_of(table: pd.DataFrame) -> pd.Series:
    """The request number of each row of a batch's prediction table."""
    if not len(table):
        return pd.Series(dtype=int)
    return table[S.ASSET].str.split(_SEP, n=1).str[0].astype(int)


def _part(table: pd.DataFrame, request_of: pd.Series, k: int) -> pd.DataFrame:
    """Request ``k``'s rows of a batch's table, with its own asset ids."""
    part = table.loc[(request_of == k).to_numpy()].copy()
    part[S.ASSET] = part[S.ASSET].str.split(_SEP, n=1).str[1]
    return part.reset_index(drop=True)


def _timed(part: pd.DataFrame, origins: dict[str, float] | None) -> pd.DataFrame:
    """A request's prediction rows with ``scored_t``: when each window ended (seconds; NaN for
    grid rows, which carry no clock), for the evidence flow's join with failure events."""
    from solutions.sensor.online import window_end_seconds

    return part.assign(**{SCORED_T: window_end_seconds(part, origins, AlignConfig().step_seconds)})


def _decided_rows(p: _Predicted) -> np.ndarray:
    """Per challenger row, whether it answered (its asset is one the split gives it)."""
    assert p.challenger_table is not None
    if p.by_challenger is None:
        return np.zeros(len(p.challenger_table), dtype=bool)
    answered = set(p.table.loc[p.by_challenger, S.ASSET])
    return p.challenger_table[S.ASSET].isin(answered).to_numpy()


def check_request_size(body: SensorPredictRequest, request: Request, services: Services) -> None:
    """Refuse a request over the size limits: its grid rows (``check_rows``) or its readings (413)."""
    if body.grid is not None:
        check_rows(request, len(body.grid))
    elif len(body.rows) > services.tuning.max_readings:
        raise HTTPException(status_code=413, detail=f"{len(body.rows)} readings in one request; the limit is "
                            f"{services.tuning.max_readings}")


def build(services: Services) -> Vertical | None:
    """The sensor vertical of the API (None when no sensor model is configured)."""
    name = services.settings.sensor_model
    if not name:
        return None
    slot = services.slot(name, lambda ref: load_online_model(ref, services))
    challenger = services.challenger(name, services.settings.sensor_challenger_mode,
                                     lambda ref: load_online_model(ref, services))

    def challenger_tables(grids: list[pd.DataFrame | Exception], champion: int,
                          ) -> tuple[ModelRef | None, pd.DataFrame | None]:
        """The challenger's predictions of the grids it can read (None: no challenger, or its call failed)."""
        from solutions.sensor.online import check_grid, predict_grid

        current = challenger.current() if challenger is not None else None
        if current is None or current[0].version == champion:
            return None, None
        ch_ref, ch_model = current
        usable = []
        for grid in grids:
            if isinstance(grid, pd.DataFrame):
                try:
                    check_grid(ch_model, grid)
                except DataValidationError:
                    continue  # the challenger reads a feature this request lacks: the champion alone
                usable.append(grid)
        if not usable:
            return None, None
        assert challenger is not None
        table = challenger.call(lambda: predict_grid(ch_model, pd.concat(usable, ignore_index=True)))
        return (ch_ref, table) if table is not None else (None, None)

    def predict_batch(items: list[_Item]) -> list[_Result]:
        from solutions.sensor.online import check_grid, grid_from_readings, grid_from_rows, predict_grid

        ref, model = slot.current()
        window = int(model.preprocessing[1].length)
        grids: list[pd.DataFrame | Exception] = []
        origins: list[dict[str, float] | None] = []  # per request: each asset's grid origin (readings only)
        for k, body in enumerate(items):
            origins.append(None)
            try:  # each request checked alone: a bad one fails itself, not the model call it shares
                if body.grid is not None:
                    grid = grid_from_rows(body.grid)
                else:
                    grid, _, origins[k] = grid_from_readings(body.rows, body.columns, window=window)
                check_grid(model, grid)
            except (DataValidationError, ValueError) as exc:
                grids.append(exc)
                continue
            grid[S.ASSET] = f"{k}{_SEP}" + grid[S.ASSET].astype(str)
            grids.append(grid)
        good = [g for g in grids if isinstance(g, pd.DataFrame)]
        table = pd.DataFrame()
        if good:
            with slot.breaker.guard():
                table = predict_grid(model, pd.concat(good, ignore_index=True))
            services.metrics.observe_batch(name, len(table))
        ch_ref, ch_table = challenger_tables(grids, ref.version) if good else (None, None)
        request_of = _request_of(table)
        ch_request_of = _request_of(ch_table) if ch_table is not None else None
        out: list[_Result] = []
        for k, grid in enumerate(grids):
            if isinstance(grid, Exception):
                out.append((ref, grid))
                continue
            part = _timed(_part(table, request_of, k), origins[k])
            predicted = _Predicted(part)
            if ch_table is not None and ch_request_of is not None and challenger is not None:
                ch_part = _timed(_part(ch_table, ch_request_of, k), origins[k])
                if len(ch_part):
                    assets = part[S.ASSET].tolist()
                    by_ch = challenger.answers(assets) & part[S.ASSET].isin(ch_part[S.ASSET]).to_numpy()
                    predicted = _Predicted(part, ch_ref, ch_part, by_ch)
            out.append((ref, predicted))
        record_predictions(ref, out)
        return out

    def record_predictions(ref: ModelRef, out: list[_Result]) -> None:
        done = [p for _, p in out if isinstance(p, _Predicted) and len(p.table)]
        if not done:
            return

        def record(version: int, role: str, tables: list[pd.DataFrame], decided: list[np.ndarray]) -> None:
            frame = pd.concat(tables, ignore_index=True)
            services.scores.record(ScoreRecord(
                model=name, version=version, role=role, ids=frame[S.ASSET].astype(str).tolist(),
                scores=frame["predicted_rul"].astype(float).tolist(), decided=np.concatenate(decided).tolist(),
                extra={"step": frame[S.STEP].astype(int).tolist(),
                       "failure_probability": frame["failure_probability"].astype(float).tolist(),
                       SCORED_T: [None if np.isnan(t) else float(t) for t in frame[SCORED_T].to_numpy(float)]}))

        record(ref.version, CHAMPION_ROLE, [p.table for p in done],
               [~p.by_challenger if p.by_challenger is not None else np.ones(len(p.table), dtype=bool)
                for p in done])
        shadowed = [p for p in done if p.challenger_table is not None and p.challenger is not None]
        if shadowed:
            assert shadowed[0].challenger is not None
            record(shadowed[0].challenger.version, CHALLENGER_ROLE,
                   [p.challenger_table for p in shadowed if p.challenger_table is not None],
                   [_decided_rows(p) for p in shadowed])

    batcher: DynamicBatcher[_Item, _Result] = DynamicBatcher(
        predict_batch, services.settings.batch_max_size, services.tuning.batch_max_wait_ms, name="sensor-batcher")
    router = APIRouter(tags=["sensor"])

    @router.post("/v1/sensor/predict", response_model=SensorPredictResponse)
    async def predict(body: Annotated[SensorPredictRequest, Body(openapi_examples=OPENAPI_EXAMPLES)], request: Request,
                      principal: Annotated[Principal, Depends(require_scope(SCOPE))]) -> SensorPredictResponse:
        """Predict RUL, failure probability and alert for each asset's latest window."""
        check_request_size(body, request, services)
        if body.grid is None and not body.rows:
            raise HTTPException(status_code=422, detail="the request holds no readings")
        [(ref, result)] = await batcher.submit([body])
        if isinstance(result, DataValidationError):
            raise HTTPException(status_code=422, detail={"error": str(result), "column": result.column,
                                                         "rows": result.rows})
        if isinstance(result, Exception):  # a ValueError of the request's content (e.g. its column mapping)
            raise HTTPException(status_code=422, detail={"error": str(result)})
        if result.table.empty:
            raise HTTPException(status_code=422, detail={"error": "no asset has a usable window of readings"})
        threshold = float(ref.params.get("threshold", 0.5))
        predictions = [
            AssetPrediction(asset_id=str(r[S.ASSET]), step=int(r[S.STEP]), predicted_rul=float(r["predicted_rul"]),
                            failure_probability=float(r["failure_probability"]), alert=bool(r["alert"]),
                            threshold=threshold, model=ref.name, model_version=ref.version)
            for r in result.table.to_dict("records")
        ]
        if result.by_challenger is not None and result.by_challenger.any():  # split: the challenger's assets
            ch, ch_table = result.challenger, result.challenger_table
            assert ch is not None and ch_table is not None
            ch_rows = {str(r[S.ASSET]): r for r in ch_table.to_dict("records")}
            ch_threshold = float(ch.params.get("threshold", 0.5))
            for i in np.flatnonzero(result.by_challenger).tolist():
                r = ch_rows[predictions[i].asset_id]
                predictions[i] = AssetPrediction(
                    asset_id=predictions[i].asset_id, step=int(r[S.STEP]), predicted_rul=float(r["predicted_rul"]),
                    failure_probability=float(r["failure_probability"]), alert=bool(r["alert"]),
                    threshold=ch_threshold, model=ch.name, model_version=ch.version)
        alerts = sum(p.alert for p in predictions)
        record_audit(request, model=ref.name, model_version=ref.version, rows=len(body.rows),
                     decisions={"alert": alerts, "ok": len(predictions) - alerts},
                     subjects=[p.asset_id for p in predictions])
        return SensorPredictResponse(model=ref.name, model_version=ref.version, predictions=predictions)

    return Vertical("sensor", router, [slot], on_stop=batcher.close)
