"""The fraud vertical's flows: ``fraud-train``, ``fraud-adapt``, ``fraud-score``,
``fraud-batch-score``, ``fraud-monitor``, ``fraud-tune`` and ``fraud-reproduce``.

Run ``python -m flows.fraud <command> --help``; the deployments name them by entrypoint
(``flows.fraud:fraud_train``). Steps live in :mod:`flows.fraud.steps`, the command line in
:mod:`flows.fraud.cli`, the domain logic in :mod:`solutions.fraud`.

The names below are imported on first use (PEP 562), so importing a light module of the
package (its ``cli``) does not import every flow, torch and Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flows.cli import lazy_exports

#: exported name -> the module that defines it
_EXPORTS = {
    "FraudAdaptResult": "flows.fraud.results",
    "FraudBatchScoreResult": "flows.fraud.results",
    "FraudMonitorResult": "flows.fraud.results",
    "FraudScoreResult": "flows.fraud.results",
    "FraudTrainResult": "flows.fraud.results",
    "FraudTuneResult": "flows.fraud.results",
    "fraud_adapt": "flows.fraud.adapt",
    "fraud_batch_score": "flows.fraud.score",
    "fraud_monitor": "flows.fraud.monitor",
    "fraud_reproduce": "flows.fraud.reproduce",
    "fraud_score": "flows.fraud.score",
    "fraud_train": "flows.fraud.train",
    "fraud_tune": "flows.fraud.tune",
}

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

if TYPE_CHECKING:
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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
