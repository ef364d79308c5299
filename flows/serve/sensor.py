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

from typing import TYPE_CHECKING, Annotated, Any

import pandas as pd
from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.errors import DataValidationError
from infra.registry import ModelRef
from infra.serving.audit import record_audit
from infra.serving.auth import Principal, require_scope
from infra.serving.batching import DynamicBatcher
from infra.serving.quotas import check_rows
from infra.serving.runtime import Services, Vertical
from solutions.sensor import schema as S

if TYPE_CHECKING:  # the model code (torch, Lightning) is imported when a model loads, not at startup
    from solutions.sensor.online import OnlineSensorModel

SCOPE = "sensor:predict"
_SEP = "\x1f"  # request number and asset id, while requests share one model call

_EXAMPLE = {
    "readings": [
        {"asset_id": "pump-7", "timestamp": "2025-03-01T10:00:00", "sensor": "temperature", "value": 71.2},
        {"asset_id": "pump-7", "timestamp": "2025-03-01T10:00:05", "sensor": "vibration", "value": 0.31},
    ]
}


class SensorPredictRequest(BaseModel):
    """Recent readings of one or more assets: ``readings`` (long format) or ``grid`` (aligned)."""

    model_config = ConfigDict(json_schema_extra={"examples": [_EXAMPLE]})

    readings: list[dict[str, Any]] | None = Field(
        default=None, description="Long format: one object per reading (asset_id, timestamp, sensor, value).")
    grid: list[dict[str, Any]] | None = Field(
        default=None, description="Aligned grid: one object per (asset_id, step) with the feature and gap__ columns.")
    columns: dict[str, str] | None = Field(
        default=None, description="Column mapping canonical -> source name for long-format readings.",
        examples=[{"asset_id": "machine", "sensor": "probe"}])

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
    model_version: int


class SensorPredictResponse(BaseModel):
    """One prediction per asset (sorted by asset id), with the version that scored them."""

    model: str
    model_version: int
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


_Item = SensorPredictRequest
_Result = tuple[ModelRef, "pd.DataFrame | Exception"]


def build(services: Services) -> Vertical | None:
    """The sensor vertical of the API (None when no sensor model is configured)."""
    name = services.settings.sensor_model
    if not name:
        return None
    slot = services.slot(name, lambda ref: load_online_model(ref, services))

    def predict_batch(items: list[_Item]) -> list[_Result]:
        from solutions.sensor.online import grid_from_readings, grid_from_rows, predict_grid

        ref, model = slot.current()
        grids: list[pd.DataFrame | Exception] = []
        for k, body in enumerate(items):
            try:
                grid = grid_from_rows(body.grid) if body.grid is not None else grid_from_readings(
                    body.rows, body.columns)[0]
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
        out: list[_Result] = []
        request_of = table[S.ASSET].str.split(_SEP, n=1).str[0].astype(int) if len(table) else pd.Series(dtype=int)
        for k, grid in enumerate(grids):
            if isinstance(grid, Exception):
                out.append((ref, grid))
                continue
            part = table.loc[(request_of == k).to_numpy()].copy()
            part[S.ASSET] = part[S.ASSET].str.split(_SEP, n=1).str[1]
            out.append((ref, part.reset_index(drop=True)))
        return out

    batcher: DynamicBatcher[_Item, _Result] = DynamicBatcher(
        predict_batch, services.settings.batch_max_size, services.settings.batch_max_wait_ms, name="sensor-batcher")
    router = APIRouter(tags=["sensor"])

    @router.post("/v1/sensor/predict", response_model=SensorPredictResponse)
    async def predict(body: SensorPredictRequest, request: Request,
                      principal: Annotated[Principal, Depends(require_scope(SCOPE))]) -> SensorPredictResponse:
        """Predict RUL, failure probability and alert for each asset's latest window."""
        if body.grid is not None:
            check_rows(request, len(body.grid))
        elif len(body.rows) > services.settings.max_readings:
            raise HTTPException(status_code=413, detail=f"{len(body.rows)} readings in one request; the limit is "
                                f"{services.settings.max_readings}")
        elif not body.rows:
            raise HTTPException(status_code=422, detail="the request holds no readings")
        [(ref, result)] = await batcher.submit([body])
        if isinstance(result, DataValidationError):
            raise HTTPException(status_code=422, detail={"error": str(result), "column": result.column,
                                                         "rows": result.rows})
        if isinstance(result, Exception):
            raise HTTPException(status_code=422, detail={"error": str(result)})
        if result.empty:
            raise HTTPException(status_code=422, detail={"error": "no asset has a usable window of readings"})
        threshold = float(ref.params.get("threshold", 0.5))
        predictions = [
            AssetPrediction(asset_id=str(r[S.ASSET]), step=int(r[S.STEP]), predicted_rul=float(r["predicted_rul"]),
                            failure_probability=float(r["failure_probability"]), alert=bool(r["alert"]),
                            threshold=threshold, model=ref.name, model_version=ref.version)
            for r in result.to_dict("records")
        ]
        alerts = sum(p.alert for p in predictions)
        record_audit(request, model=ref.name, model_version=ref.version, rows=len(body.rows),
                     decisions={"alert": alerts, "ok": len(predictions) - alerts},
                     subjects=[p.asset_id for p in predictions])
        return SensorPredictResponse(model=ref.name, model_version=ref.version, predictions=predictions)

    return Vertical("sensor", router, [slot], on_stop=batcher.close)
