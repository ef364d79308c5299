"""The sensor vertical's governance steps: the champion compared on the same test cuts
(paired bootstrap of RUL RMSE), the lineage of a trained version and its model card."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from infra.registry import ChampionComparison, ModelRef, ModelRegistry
from infra.resources import TrainerArgs
from solutions.sensor import card as SCARD
from solutions.sensor import evaluate as E
from solutions.sensor import pipeline as P
from solutions.sensor.config import SensorConfig, SensorSource
from solutions.sensor.metrics import engine_of, weighted_phm08
from tasks.cards import (
    ChampionCheck,
    Comparison,
    build_card,
    check_champion,
    intervals,
    paired,
    publish_card,
    small_sample_limitations,
    write_card,
)
from tasks.data import DatasetRef
from tasks.lineage import Lineage, collect_lineage
from tasks.register import RegistrationResult
from tasks.train import TrainResult

#: The champion rule's metric in :mod:`tasks.stats` terms (``test/rmse``, lower is better).
METRIC = "rmse"
#: How the card names the other candidates of a training run.
CANDIDATE_LABELS = {"cnn": "1D-CNN (same run)", "baseline": E.BASELINE_NAME,
                    "ensemble": "mean of 1D-CNN and HistGB (same run)"}


def champion_check(name: str, data: P.SupervisedData, candidate: E.TestPredictions,
                   champion: ModelRef | None = None) -> ChampionCheck | None:
    """The candidate's RUL predictions vs the champion's (or ``champion``'s) on the same test cuts."""
    registry = ModelRegistry()
    y = data.test_last.rul

    def score(version: ModelRef) -> np.ndarray:
        y_theirs, pred = E.rul_predictions(registry, version, data)
        if y_theirs.shape != y.shape or not np.allclose(y_theirs, y, equal_nan=True):
            raise ValueError(f"{version.spec} cuts the test units into other windows")
        return pred

    return check_champion(registry, name, METRIC, y, candidate.rul_last, score, champion)


@task(name="compare-with-champion", cache_policy=NONE)
def compare_with_champion(name: str, data: P.SupervisedData, candidate: E.TestPredictions) -> ChampionCheck | None:
    """The champion re-scored on this run's test cuts and a paired bootstrap of 'the candidate is better'."""
    return champion_check(name, data, candidate)


def _recompare(name: str, data: P.SupervisedData, candidate: E.TestPredictions,
               champion: ModelRef) -> ChampionComparison | None:
    check = champion_check(name, data, candidate, champion)
    return check.comparison() if check is not None else None


def recompare_with(name: str, data: P.SupervisedData,
                   candidate: E.TestPredictions) -> Callable[[ModelRef], ChampionComparison | None]:
    """What promotion calls inside the registry lock when the champion moved meanwhile."""
    return functools.partial(_recompare, name, data, candidate)


@task(name="collect-lineage", cache_policy=NONE)
def sensor_lineage(grid_ref: DatasetRef, source: SensorSource, config: SensorConfig, setup: P.SupervisedSetup,
                   encoder: ModelRef | None, hardware: TrainerArgs | None, trained: TrainResult) -> Lineage:
    """Data hash, assets and windows per split, seeds, software, hardware and the flow's parameters."""
    rows = {f"assets/{k}": len(v) for k, v in setup.splits.items()}
    rows.update({f"windows/{k}": v for k, v in setup.data.window_counts().items()})
    seeds = {"split": config.split.seed, "finetune": config.finetune.seed, "pretrain": config.pretrain.seed}
    if not source.data and not source.cmapss_dir:
        seeds["synthetic_fleet"] = config.fleet.seed
    return collect_lineage(data_hash=grid_ref.content_hash, data_source=source.describe(), rows=rows,
                           seeds=seeds, hardware=hardware, precision=trained.precision,
                           parent=encoder.spec if encoder else None)


@task(name="write-model-card", cache_policy=NONE)
def sensor_card(registration: RegistrationResult, source: SensorSource, setup: P.SupervisedSetup,
                winner: str, candidates: dict[str, E.TestPredictions], champion: ChampionCheck | None,
                validation: str | None = None) -> str:
    """The version's model card (``card.json`` + ``card.md`` in its folder, and an artifact): the
    registered candidate's test metrics, compared with the run's other candidates and the champion;
    ``validation``: what the candidate was chosen on."""
    data = setup.data
    y = data.test_last.rul
    registered = candidates[winner]
    # bootstrap over engines: the cuts of one test engine are resampled together
    engines = engine_of(data.test_last.asset)
    metrics = intervals(y, registered.rul_last, ["rmse", "phm08", "mae"], groups=engines,
                        custom={"phm08": weighted_phm08})
    y_fail = E.fail_labels(data.test_all)
    if E.has_both_classes(y_fail):
        metrics += intervals(y_fail, registered.prob_all, ["pr_auc", "roc_auc"])
    comparisons = [Comparison(against=CANDIDATE_LABELS.get(name, name),
                              test=paired(METRIC, y, registered.rul_last, other.rul_last))
                   for name, other in candidates.items() if name != winner]
    if champion is not None and champion.test is not None and champion.version != registration.model.version:
        comparisons.append(Comparison(against=f"champion before ({champion.champion})", test=champion.test))
    card = build_card(
        registration.model, title=SCARD.TITLE, intended_use=SCARD.INTENDED_USE,
        features=list(setup.normalizer.channels_), metrics=metrics, comparisons=comparisons,
        limitations=[*SCARD.LIMITATIONS, *small_sample_limitations(metrics[:1])],
        promotion=registration.decision.model_dump(),
        data={"input": source.describe(), "test units": len(y), "test engines": len(set(engines)),
              "metric windows": "last window of each cut test unit",
              "intervals": "bootstrap over test engines (a cut engine's units resampled together); "
                           "phm08: the PHM08 score, summed over the test units",
              **({"candidate chosen on": validation} if validation else {})},
    )
    markdown = write_card(ModelRegistry(), registration.model, card)
    publish_card(markdown, registration.model.name)
    return markdown
