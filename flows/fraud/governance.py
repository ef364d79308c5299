"""The fraud vertical's governance steps: the champion compared on the same test rows
(paired bootstrap), the lineage of a trained version and its model card."""

from __future__ import annotations

import functools
from collections.abc import Callable

from prefect import task
from prefect.cache_policies import NONE

from flows.fraud.results import PreparedFeatures
from infra.registry import ChampionComparison, ModelRef, ModelRegistry
from infra.resources import TrainerArgs
from solutions.fraud import candidates as CA
from solutions.fraud import card as FC
from solutions.fraud import pipeline as P
from solutions.fraud import scoring as SC
from solutions.fraud.config import FraudTrainConfig
from tasks.cards import (
    ChampionCheck,
    Comparison,
    Section,
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

#: The champion rule's metric in :mod:`tasks.stats` terms (``test/auprc``).
METRIC = "pr_auc"
#: How the card names the other candidates of a training run.
CANDIDATE_LABELS = {CA.SEQUENCE: "sequence model (same run)", CA.BASELINE: "baseline (HistGB on window features)",
                    CA.ENSEMBLE: "ensemble of sequence model and HistGB (same run)"}


def champion_check(model_name: str, ref: DatasetRef, prepared: PreparedFeatures, candidate: SC.ValTestScores,
                   champion: ModelRef | None = None) -> ChampionCheck | None:
    """The candidate's test scores vs the champion's (or ``champion``'s) on the same rows."""
    registry = ModelRegistry()

    def score(version: ModelRef):
        return SC.scores_for(version, registry, ref.read(), prepared.features.read(), "test")

    return check_champion(registry, model_name, METRIC, candidate.y_test, candidate.s_test, score, champion)


@task(name="compare-with-champion", cache_policy=NONE)
def compare_with_champion(model_name: str, ref: DatasetRef, prepared: PreparedFeatures,
                          candidate: SC.ValTestScores) -> ChampionCheck | None:
    """The champion re-scored on this test period and a paired bootstrap of 'the candidate is better'."""
    return champion_check(model_name, ref, prepared, candidate)


def _recompare(model_name: str, ref: DatasetRef, prepared: PreparedFeatures, candidate: SC.ValTestScores,
               champion: ModelRef) -> ChampionComparison | None:
    check = champion_check(model_name, ref, prepared, candidate, champion)
    return check.comparison() if check is not None else None


def recompare_with(model_name: str, ref: DatasetRef, prepared: PreparedFeatures,
                   candidate: SC.ValTestScores) -> Callable[[ModelRef], ChampionComparison | None]:
    """What promotion calls inside the registry lock when the champion moved meanwhile."""
    return functools.partial(_recompare, model_name, ref, prepared, candidate)


@task(name="collect-lineage", cache_policy=NONE)
def fraud_lineage(ref: DatasetRef, prepared: PreparedFeatures, config: FraudTrainConfig, data: str | None,
                  hardware: TrainerArgs, trained: TrainResult, source: str | None = None) -> Lineage:
    """Data hash and rows per period, seeds, software, hardware and the flow's parameters."""
    seeds = {"model": config.model.seed, "baseline": config.model.seed}
    accumulated = source == "accumulated"
    if data is None and not accumulated:
        seeds["synthetic_data"] = config.data.seed
    described = ("accumulated dataset (latest window of scored and labelled transactions)" if accumulated
                 else data or "synthetic (seeded generator)")
    return collect_lineage(data_hash=ref.content_hash, data_source=described,
                           rows=prepared.rows, period={"periods": prepared.split}, seeds=seeds, hardware=hardware,
                           precision=trained.precision)


@task(name="write-model-card", cache_policy=NONE)
def fraud_card(registration: RegistrationResult, ref: DatasetRef, prepared: PreparedFeatures,
               setup: P.SequenceSetup, choice: CA.CandidateChoice, champion: ChampionCheck | None,
               k: int = FC.DEFAULT_K) -> str:
    """The version's model card (``card.json`` + ``card.md`` in its folder, and an artifact): the
    registered candidate's test metrics, compared with the other candidates of the run and the champion."""
    registered = choice.scores[choice.winner]
    y, s = registered.y_test, registered.s_test
    metrics = intervals(y, s, ["pr_auc", "roc_auc"])
    comparisons = [Comparison(against=CANDIDATE_LABELS[name], test=paired(METRIC, y, s, other.s_test))
                   for name, other in choice.scores.items() if name != choice.winner]
    if champion is not None and champion.test is not None and champion.version != registration.model.version:
        comparisons.append(Comparison(against=f"champion before ({champion.champion})", test=champion.test))
    df, feats = ref.read(), prepared.features.read()
    test_rows = df.loc[(feats[P.PERIOD] == "test").to_numpy()]
    days = FC.per_day_metrics(test_rows, s, k)
    section = Section(
        title="Per test day", columns=list(days[0]) if days else [],
        rows=[list(d.values()) for d in days],
        note=f"Mean card precision@{k}: {FC.mean_card_precision(days, k):.4f} (share of compromised accounts "
             f"among the {k} highest-scored accounts of each day).",
    )
    card = build_card(
        registration.model, title=FC.TITLE, intended_use=FC.INTENDED_USE,
        features=FC.feature_names(setup.preprocessor.window_feature_names),
        metrics=metrics, comparisons=comparisons, sections=[section],
        limitations=[*FC.LIMITATIONS, *small_sample_limitations(metrics, int(y.sum()))],
        promotion=registration.decision.model_dump(),
    )
    markdown = write_card(ModelRegistry(), registration.model, card)
    publish_card(markdown, registration.model.name)
    return markdown
