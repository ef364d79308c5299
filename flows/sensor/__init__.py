"""Sensor fault prediction flows: ``sensor-pretrain``, ``sensor-train``, ``sensor-score`` and
``sensor-batch-score``, ``sensor-monitor``, ``sensor-reproduce`` (``python -m flows.sensor --help``).

The names below are imported on first use (PEP 562), so importing a light module of the
package (its ``cli``) does not import every flow, torch and Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flows.cli import lazy_exports

#: exported name -> the module that defines it
_EXPORTS = {
    "SensorBatchScoreResult": "flows.sensor.results",
    "SensorMonitorResult": "flows.sensor.results",
    "SensorPretrainResult": "flows.sensor.results",
    "SensorScoreResult": "flows.sensor.results",
    "SensorTrainResult": "flows.sensor.results",
    "sensor_batch_score": "flows.sensor.batch",
    "sensor_monitor": "flows.sensor.monitor",
    "sensor_pretrain": "flows.sensor.pretrain",
    "sensor_reproduce": "flows.sensor.reproduce",
    "sensor_score": "flows.sensor.score",
    "sensor_train": "flows.sensor.train",
}

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

if TYPE_CHECKING:
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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
