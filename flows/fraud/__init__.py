"""The fraud vertical's flows: ``fraud-train``, ``fraud-adapt``, ``fraud-score``,
``fraud-batch-score``, ``fraud-monitor`` and ``fraud-tune``.

Run ``python -m flows.fraud <command> --help``; the deployments name them by entrypoint
(``flows.fraud:fraud_train``). Steps live in :mod:`flows.fraud.steps`, the command line in
:mod:`flows.fraud.cli`, the domain logic in :mod:`solutions.fraud`.
"""

from __future__ import annotations

from flows.fraud.adapt import fraud_adapt
from flows.fraud.monitor import fraud_monitor
from flows.fraud.reproduce import fraud_reproduce
from flows.fraud.results import (
    FraudAdaptResult,
    FraudBatchScoreResult,
    FraudMonitorResult,
    FraudScoreResult,
    FraudTrainResult,
    FraudTuneResult,
)
from flows.fraud.score import fraud_batch_score, fraud_score
from flows.fraud.train import fraud_train
from flows.fraud.tune import fraud_tune

__all__ = [
    "FraudAdaptResult",
    "FraudBatchScoreResult",
    "FraudMonitorResult",
    "FraudScoreResult",
    "FraudTrainResult",
    "FraudTuneResult",
    "fraud_adapt",
    "fraud_batch_score",
    "fraud_monitor",
    "fraud_reproduce",
    "fraud_score",
    "fraud_train",
    "fraud_tune",
]
