"""``python -m flows.sensor forecast`` and ``forecast-train`` end to end on a tiny fleet, against a
real (test) Prefect API: a forecaster trained first when none is registered, the forecasts and
alerts written, the champion rule re-scoring the champion on the same held-out assets."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from flows.sensor.cli import main
from infra.registry import ModelRegistry
from solutions.sensor import forecast as F
from solutions.sensor import schema as S
from solutions.sensor.forecast_config import KIND

FLEET = ["--n-assets", "12", "--min-life", "45", "--max-life", "70", "--seed", "1"]
FAST = ["--horizon", "5", "--candidates", "naive", "auto_ets"]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_forecast_trains_first_then_forecasts_every_asset_with_alerts(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "forecasts.parquet"
    args = ["forecast", *FLEET, *FAST, "--model", "fc-tiny", "--upper-limits", "temperature=104",
            "--output", str(target), "--json"]
    assert main(args) == 0
    out = capsys.readouterr().out
    result = _last_json(out)
    assert result["model"] == "fc-tiny:1" and len(ModelRegistry().versions("fc-tiny")) == 1  # trained first
    table = pd.read_parquet(target)
    assert len(table) == result["rows"] == result["assets"] * result["sensors"] * 5 and result["assets"] == 12
    assert table["steps_ahead"].between(1, 5).all() and (table["model_version"] == 1).all()
    # the alerts are the first step each asset's temperature interval goes above 104
    expected = F.limit_alerts(table, {"temperature": 104.0}, {}, "bound")
    assert [(a["asset_id"], a["steps_ahead"]) for a in result["alerts"]] == \
        list(zip(expected[S.ASSET], expected["steps_ahead"], strict=True))
    assert len(pd.read_parquet(result["alerts_output"])) == len(result["alerts"]) > 0
    assert Path(result["plot"]).stat().st_size > 0
    ref = ModelRegistry().get("fc-tiny")
    assert ref.kind == KIND and ref.version == 1 and ref.primary_metric == "test/mase"
    assert {"test/mase", "test/coverage", "test/mase_naive", "test/mase_seasonal_naive"} <= set(ref.metrics)

    # a second training on the same data: the champion is re-scored on the same held-out assets
    assert main(["forecast-train", *FLEET, *FAST, "--model", "fc-tiny", "--json"]) == 0
    trained = _last_json(capsys.readouterr().out)
    assert trained["model"]["version"] == 2
    assert trained["promotion"]["champion_value"] == pytest.approx(ref.metrics["test/mase"])
    assert trained["promotion"]["promoted"] is False  # the same choice, no better
    report = Path(trained["report_dir"], "report.md").read_text()
    assert "| h | chosen MASE | chosen cover |" in report and "naive MASE" in report


def test_a_model_that_is_no_forecaster_is_refused_before_the_run(capsys: pytest.CaptureFixture) -> None:
    registry = ModelRegistry()
    registry.register("not-a-forecaster", {}, params={}, metrics={"m": 1.0}, primary_metric="m", kind="sklearn-skops")
    assert main(["forecast", *FLEET, "--model", "not-a-forecaster:1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: --model: not-a-forecaster:1 is a sklearn-skops")
    assert main(["forecast", *FLEET, "--model", "no-such-model:3"]) == 2
    assert "no-such-model" in capsys.readouterr().err
