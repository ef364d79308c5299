"""``POST /v1/sensor/predict``: the sensor champion's RUL, failure probability and alert for
the latest window of each asset in a request.

A request carries recent readings of one or more assets, in long format (``readings``:
asset_id, timestamp, sensor, value, or source names with ``columns``) or as the aligned grid
(``grid``). They are aligned and normalised by the batch path's own functions
(:mod:`solutions.sensor.online`), so an asset scores as ``sensor score`` scores it in a file.
Readings covering the model's window plus the forward-fill limit and one step (e.g. the last 34
hours for a 30-step window of hourly steps) give the same answer as the asset's whole history.
:class:`SensorPredictor` is the model in four methods; :class:`~infra.serving.model_route.ModelRoute`
serves it (concurrent requests share one model call; breaker, reload, challenger, score log, audit).
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
from infra.serving.auth import Principal, require_scope
from infra.serving.model_route import ModelRoute
from infra.serving.predictor import Answer, Audit, Encoded, Predictor, Rows
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
    from solutions.sensor.inference import build_module
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
class Predicted:
    """One request's predictions (the latest window of each asset, with ``scored_t``), the grid they were
    made from (what a challenger predicts from; None for the challenger's own) and each asset's grid
    origin (long-format readings only)."""

    table: pd.DataFrame
    grid: pd.DataFrame | None = None
    origins: dict[str, float] | None = None


def _tagged(grid: pd.DataFrame, k: int) -> pd.DataFrame:
    """``grid`` with its asset ids prefixed by the request's number, while requests share one model call."""
    return grid.assign(**{S.ASSET: f"{k}{_SEP}" + grid[S.ASSET].astype(str)})


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


def _predict_grids(model: OnlineSensorModel, grids: dict[int, pd.DataFrame],
                   origins: list[dict[str, float] | None]) -> dict[int, Predicted]:
    """One model call over the grids of several requests (by request number); each request's predictions."""
    from solutions.sensor.online import predict_grid

    table = predict_grid(model, pd.concat([_tagged(g, k) for k, g in grids.items()], ignore_index=True))
    request_of = _request_of(table)
    return {k: Predicted(_timed(_part(table, request_of, k), origins[k]), grid, origins[k])
            for k, grid in grids.items()}


def check_request_size(body: SensorPredictRequest, request: Request, services: Services) -> None:
    """Refuse a request over the size limits: its grid rows (``check_rows``) or its readings (413)."""
    if body.grid is not None:
        check_rows(request, len(body.grid))
    elif len(body.rows) > services.tuning.max_readings:
        raise HTTPException(status_code=413, detail=f"{len(body.rows)} readings in one request; the limit is "
                            f"{services.tuning.max_readings}")


def request_grid(body: SensorPredictRequest, window: int | None = None,
                 ) -> tuple[pd.DataFrame, dict[str, float] | None]:
    """The request's aligned grid and, for long-format readings, each asset's grid origin (None for
    grid rows); ``window`` (the model's) words the error of a history that is too short."""
    from solutions.sensor.online import grid_from_readings, grid_from_rows

    if body.grid is not None:
        return grid_from_rows(body.grid), None
    grid, _, origins = grid_from_readings(body.rows, body.columns, window=window)
    return grid, origins


class SensorPredictor(Predictor[SensorPredictRequest, "OnlineSensorModel", Predicted]):
    """Predict RUL, failure probability and alert for each asset's latest window."""

    path = "/v1/sensor/predict"
    route_name = "predict"
    tag = "sensor"
    response_model = SensorPredictResponse

    def __init__(self, model_name: str, services: Services) -> None:
        super().__init__(model_name)
        self.services = services

    def setup(self, ref: ModelRef) -> OnlineSensorModel:
        return load_online_model(ref, self.services)

    async def decode_request(self, body: Annotated[SensorPredictRequest, Body(openapi_examples=OPENAPI_EXAMPLES)],
                             request: Request, principal: Annotated[Principal, Depends(require_scope(SCOPE))],
                             ) -> SensorPredictRequest:
        """The body (422 when invalid or empty, 413 over the size limits)."""
        check_request_size(body, request, self.services)
        if body.grid is None and not body.rows:
            raise HTTPException(status_code=422, detail="the request holds no readings")
        return body

    def predict(self, model: OnlineSensorModel, items: list[SensorPredictRequest],
                challenger: OnlineSensorModel | None = None) -> list[Predicted | Exception]:
        """Each request aligned and checked alone (a bad one fails itself, not the model call it
        shares), then one model call over the good ones."""
        from solutions.sensor.online import check_grid

        window = int(model.preprocessing[1].length)
        errors: dict[int, Exception] = {}
        grids: dict[int, pd.DataFrame] = {}
        origins: list[dict[str, float] | None] = []  # per request: each asset's grid origin (readings only)
        for k, body in enumerate(items):
            origins.append(None)
            try:
                grids[k], origins[k] = request_grid(body, window)
                check_grid(model, grids[k])
            except (DataValidationError, ValueError) as exc:
                grids.pop(k, None)
                errors[k] = exc
        predicted = _predict_grids(model, grids, origins) if grids else {}
        return [errors[k] if k in errors else predicted[k] for k in range(len(items))]

    def encode_response(self, decoded: SensorPredictRequest, answer: Answer[Predicted]) -> Encoded:
        """One prediction per asset, each naming the version that decided it (422 when no asset has a window)."""
        ref, result = answer.ref, answer.output
        assert not isinstance(result, Exception)
        if result.table.empty:
            raise HTTPException(status_code=422, detail={"error": "no asset has a usable window of readings"})
        predictions = _predictions(ref, result.table)
        if answer.by_challenger.any():  # split: the challenger's assets
            ch, ch_output = answer.challenger, answer.challenger_output
            assert ch is not None and ch_output is not None
            ch_rows = {p.asset_id: p for p in _predictions(ch, ch_output.table)}
            for i in np.flatnonzero(answer.by_challenger).tolist():
                predictions[i] = ch_rows[predictions[i].asset_id]
        alerts = sum(p.alert for p in predictions)
        return Encoded(SensorPredictResponse(model=ref.name, model_version=ref.version, predictions=predictions),
                       Audit(len(decoded.rows), {"alert": alerts, "ok": len(predictions) - alerts},
                             [p.asset_id for p in predictions]))

    def rows(self, output: Predicted) -> Rows:
        table = output.table
        if not len(table):
            return Rows(subjects=[], ids=[], scores=np.zeros(0))
        assets = table[S.ASSET].astype(str).tolist()
        return Rows(subjects=assets, ids=assets, scores=table["predicted_rul"].to_numpy(float),
                    extra={"step": table[S.STEP].astype(int).tolist(),
                           "failure_probability": table["failure_probability"].astype(float).tolist(),
                           SCORED_T: [None if np.isnan(t) else float(t) for t in table[SCORED_T].to_numpy(float)]})

    def predict_challenger(self, challenger: OnlineSensorModel, items: list[SensorPredictRequest],
                           outputs: list[Predicted | Exception]) -> list[Predicted | None]:
        """The challenger's predictions from the grids the champion read (None for a request lacking a
        feature the challenger reads: the champion alone answers it)."""
        from solutions.sensor.online import check_grid

        grids: dict[int, pd.DataFrame] = {}
        for k, out in enumerate(outputs):
            if isinstance(out, Predicted) and out.grid is not None:
                try:
                    check_grid(challenger, out.grid)
                except DataValidationError:
                    continue
                grids[k] = out.grid
        origins = [o.origins if isinstance(o, Predicted) else None for o in outputs]
        predicted = _predict_grids(challenger, grids, origins) if grids else {}
        return [Predicted(predicted[k].table, None, origins[k]) if k in predicted else None
                for k in range(len(outputs))]


def _predictions(ref: ModelRef, table: pd.DataFrame) -> list[AssetPrediction]:
    """``table``'s rows as the response's predictions of version ``ref``."""
    threshold = float(ref.params.get("threshold", 0.5))
    return [AssetPrediction(asset_id=str(r[S.ASSET]), step=int(r[S.STEP]), predicted_rul=float(r["predicted_rul"]),
                            failure_probability=float(r["failure_probability"]), alert=bool(r["alert"]),
                            threshold=threshold, model=ref.name, model_version=ref.version)
            for r in table.to_dict("records")]


def build(services: Services) -> Vertical | None:
    """The sensor vertical of the API (None when no sensor model is configured)."""
    name = services.settings.sensor_model
    if not name:
        return None
    route = ModelRoute(services, SensorPredictor(name, services), challenger_mode=services.settings.sensor_challenger_mode)
    router = APIRouter(tags=["sensor"])
    route.mount(router)
    return Vertical("sensor", router, [route.slot], on_stop=route.close)
