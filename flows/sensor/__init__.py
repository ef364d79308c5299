"""Sensor fault prediction flows: ``sensor-pretrain``, ``sensor-train``, ``sensor-score`` and
``sensor-batch-score``, ``sensor-monitor`` (``python -m flows.sensor --help``)."""

from __future__ import annotations

from flows.sensor.batch import sensor_batch_score
from flows.sensor.monitor import sensor_monitor
from flows.sensor.pretrain import sensor_pretrain
from flows.sensor.reproduce import sensor_reproduce
from flows.sensor.results import (
    SensorBatchScoreResult,
    SensorMonitorResult,
    SensorPretrainResult,
    SensorScoreResult,
    SensorTrainResult,
)
from flows.sensor.score import sensor_score
from flows.sensor.train import sensor_train

__all__ = [
    "SensorBatchScoreResult",
    "SensorMonitorResult",
    "SensorPretrainResult",
    "SensorScoreResult",
    "SensorTrainResult",
    "sensor_batch_score",
    "sensor_monitor",
    "sensor_pretrain",
    "sensor_reproduce",
    "sensor_score",
    "sensor_train",
]
