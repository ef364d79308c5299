"""The fraud vertical's steps: thin tasks over :mod:`solutions.fraud` and the generic tasks.

Each step calls a solution function (plain, no Prefect) and, where a table is derived,
stores it through a generic task; flows pass the returned references along. The steps
that read a table take its :class:`~tasks.data.DatasetRef` and read it themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NONE

from flows.fraud.results import PreparedFeatures, StageReports
from infra.errors import DataValidationError
from infra.home import home_layout
from infra.registry import ChampionComparison, ModelRef, ModelRegistry
from infra.resources import TrainerArgs
from infra.store import check_name, safe_stem, stable_hash
from infra.tables import assign_periods, read_table, time_split, validate_table, write_table
from solutions.fraud import candidates as CA
from solutions.fraud import history as H
from solutions.fraud import monitoring as M
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud import scoring as SC
from solutions.fraud.config import SEARCH_SPACE, SequenceModelConfig, SplitConfig, SyntheticDataConfig
from solutions.fraud.model import FraudSequenceModel, build_module
from solutions.fraud.pipeline import accounts_schema, transaction_schema
from solutions.fraud.schema import ColumnMapping
from solutions.fraud.sequences import FraudPreprocessor
from solutions.fraud.synthetic import generate_transactions
from tasks.compress import load_variant
from tasks.data import DatasetRef, load_table_task
from tasks.evaluate import EvalReport, choose_threshold, evaluate_binary, publish_eval_report_task
from tasks.ledger import InboxFile, ScoredFile, reading_content
from tasks.prepare import materialize_table_task
from tasks.train import TrainSpec, train_model_task
from tasks.tune import Param, StudyRef, TuneConfig, storage_url, validate_space
from tasks.worker_models import load_once

log = logging.getLogger(__name__)

#: The metric the champion rule compares.
PRIMARY_METRIC = "test/auprc"
#: The metric tuning trials and early stopping maximise.
OBJECTIVE = "val/auprc"


# ------------------------------------------------------------------------------------
# data


def _generate(cfg: SyntheticDataConfig) -> pd.DataFrame:
    return generate_transactions(
        n_accounts=cfg.n_accounts, n_terminals=cfg.n_terminals, n_days=cfg.n_days,
        fraud_rate=cfg.fraud_rate, seed=cfg.seed, new_pattern=cfg.new_pattern,
    )


def obtain_transactions(
    data: str | None,
    columns: Mapping[str, str],
    synthetic: SyntheticDataConfig,
    accounts: str | None = None,
    for_scoring: bool = False,
    encoding: str | None = None,
) -> DatasetRef:
    """Validated transactions: the given file (mapped) or the seeded synthetic default,
    with the accounts table joined when one is given."""
    columns = ColumnMapping(dict(columns)).columns  # names an unknown canonical column early
    if data is None:
        generated = materialize_table_task.with_options(name="generate-transactions")(
            "fraud-synthetic", {"data": synthetic.model_dump(), "v": "1"}, lambda: _generate(synthetic)
        )
        path = Path(generated.path)
    else:
        path = Path(data).expanduser()
    ref = load_table_task(path, transaction_schema(for_scoring), columns=columns, encoding=encoding)
    if accounts:
        acc = load_table_task(Path(accounts).expanduser(), accounts_schema(), encoding=encoding)
        ref = materialize_table_task.with_options(name="merge-accounts")(
            "fraud-merged", {"tx": ref.content_hash, "accounts": acc.content_hash},
            lambda: P.merge_accounts(ref.read(), acc.read()),
        )
    return ref


def prepare_features(ref: DatasetRef, split: SplitConfig, delay_days: float) -> PreparedFeatures:
    """Window features and periods of every row, stored once per (data, split, code)."""
    timestamps = ref.read([S.TIMESTAMP])[S.TIMESTAMP]
    bounds = time_split(timestamps, train_days=split.train_days, delay_days=split.delay_days,
                        test_days=split.test_days, val_days=split.val_days)

    def build() -> pd.DataFrame:
        return P.build_features(ref.read(), assign_periods(timestamps, bounds), delay_days)

    key = {"data": ref.content_hash, "split": split.model_dump(), "delay": delay_days, "v": P.FEATURES_VERSION}
    feats = materialize_table_task.with_options(name="prepare-features")("fraud-features", key, build)
    prepared = PreparedFeatures(features=feats, split=bounds.describe(),
                                rows=SC.period_counts(feats.read([P.PERIOD])[P.PERIOD]))
    log.info("split %s; rows %s", prepared.split, prepared.rows)
    return prepared


@task(name="check-periods", cache_policy=NONE)
def check_periods(ref: DatasetRef, prepared: PreparedFeatures) -> None:
    """Fail (DataValidationError) unless train, val and test each hold both classes."""
    SC.check_both_classes(ref.read(), prepared.features.read(), prepared.split, ref.source)


# ------------------------------------------------------------------------------------
# models


@task(name="fit-baseline", cache_policy=NONE)
def fit_baseline(ref: DatasetRef, prepared: PreparedFeatures, seed: int, num_threads: int | None) -> SC.ValTestScores:
    """Fit the window-feature baseline; return its validation and test scores."""
    return SC.baseline_val_test(ref.read(), prepared.features.read(), seed, num_threads)


@task(name="fit-baseline", cache_policy=NONE)
def fit_baseline_candidate(ref: DatasetRef, prepared: PreparedFeatures, seed: int,
                           num_threads: int | None) -> CA.BaselineCandidate:
    """Fit the window-feature GBM on the train period (validation stays unseen); its scores."""
    return CA.fit_baseline_candidate(ref.read(), prepared.features.read(), seed, num_threads)


@task(name="choose-candidate", cache_policy=NONE)
def choose_candidate(sequence: SC.ValTestScores, baseline: CA.BaselineCandidate | None,
                     allowed: tuple[str, ...] | None = None) -> CA.CandidateChoice:
    """Sequence model, GBM or their ensemble (those ``allowed``): the highest validation PR-AUC wins."""
    choice = CA.choose_on_validation(sequence, baseline.scores if baseline else None, allowed)
    log.info("candidates (val PR-AUC) %s: registering the %s", choice.val_pr_auc, choice.winner)
    return choice


@dataclass(frozen=True)
class WinnerRegistration:
    """What ``register-model`` stores for the winner: module (None for the GBM), params, kind, files."""

    module: Any
    params: dict[str, Any]
    kind: str
    extra_files: dict[str, Path]


@task(name="prepare-registration", cache_policy=NONE)
def winner_registration(choice: CA.CandidateChoice, model: FraudSequenceModel, setup: P.SequenceSetup,
                        baseline: CA.BaselineCandidate | None, cfg: SequenceModelConfig, split: SplitConfig,
                        delay_days: float, out_dir: Path) -> WinnerRegistration:
    """The winner's registration: its threshold chosen on validation, its files (skops for a GBM)."""
    scores = choice.scores[choice.winner]
    common = {"threshold": val_threshold(scores.y_val, scores.s_val), "split": split.model_dump(),
              "candidate": choice.winner, "candidates_val_auprc": choice.val_pr_auc}
    params: dict[str, Any] = {}
    files: dict[str, Path] = {}
    if choice.winner != CA.BASELINE:
        params.update(P.model_params(model, setup.preprocessor, cfg))
    if choice.winner != CA.SEQUENCE and baseline is not None:
        params.update(CA.baseline_params(baseline, delay_days))
        files = CA.baseline_files(baseline, out_dir / "baseline")
    params.update(common)
    return WinnerRegistration(module=None if choice.winner == CA.BASELINE else model, params=params,
                              kind=choice.kind, extra_files=files)


@task(name="set-up-sequences", cache_policy=NONE)
def setup_sequences(ref: DatasetRef, prepared: PreparedFeatures, cfg: SequenceModelConfig,
                    preprocessor: FraudPreprocessor | None = None) -> P.SequenceSetup:
    """Fit (or reuse) the preprocessor and build the sequences' data module."""
    return P.sequence_setup(ref.read(), prepared.features.read(), cfg, preprocessor=preprocessor)


@task(name="build-sequence-model", cache_policy=NONE)
def build_sequence_model(ref: DatasetRef, prepared: PreparedFeatures, setup: P.SequenceSetup,
                         cfg: SequenceModelConfig) -> FraudSequenceModel:
    """A fresh sequence model, its class weight from the train period."""
    weight = SC.train_pos_weight(ref.read(), prepared.features.read(), cfg.negative_rate)
    return P.build_model(setup.preprocessor, cfg, weight)


def sequence_train_spec(prepared: PreparedFeatures, cfg: SequenceModelConfig, *, fresh: bool,
                        hardware: TrainerArgs | None) -> TrainSpec:
    """How to train the sequence model; the run key follows the features and the config."""
    return TrainSpec(
        run_key="fraud-seq-" + stable_hash({"data": prepared.features.content_hash, "model": cfg.model_dump()}),
        max_epochs=cfg.max_epochs, patience=cfg.patience, monitor=OBJECTIVE, mode="max", seed=cfg.seed,
        fresh=fresh, hardware=hardware,
    )


@task(name="score-val-test", cache_policy=NONE)
def score_val_test(model: FraudSequenceModel, setup: P.SequenceSetup, ref: DatasetRef,
                   prepared: PreparedFeatures) -> SC.ValTestScores:
    """The sequence model's validation and test scores."""
    return SC.sequence_val_test(model, setup, ref.read(), prepared.features.read())


def val_threshold(y_val: Any, s_val: Any, fallback: float = 0.5) -> float:
    """Max-F1 threshold on validation, or ``fallback`` when validation lacks a class."""
    return choose_threshold(y_val, s_val, method="f1") if 0 < y_val.sum() < len(y_val) else fallback


@task(name="evaluate-on-test", cache_policy=NONE)
def evaluate_on_test(name: str, scores: SC.ValTestScores, fpr_target: float, out_dir: Path) -> EvalReport:
    """Test metrics at the threshold chosen on validation (max F1), with curve images."""
    return evaluate_binary(scores.y_test, scores.s_test, name=name, split="test",
                           threshold=val_threshold(scores.y_val, scores.s_val), fpr_target=fpr_target, out_dir=out_dir)


@task(name="rescore-champion", cache_policy=NONE)
def rescore_champion(model_name: str, ref: DatasetRef, prepared: PreparedFeatures,
                     known: Mapping[int, float] | None = None) -> ChampionComparison | None:
    """The current champion's test PR-AUC on this run's data, tied to its version (``known``:
    version -> value already measured here), or None without a champion. Promotion uses it
    only while that version is still the champion (compare-and-swap)."""
    registry = ModelRegistry()
    champion = registry.champion(model_name) if model_name in registry.models() else None
    if champion is None:
        return None
    if known and champion.version in known:
        return ChampionComparison(champion_version=champion.version, champion_value=known[champion.version])
    value = SC.champion_pr_auc(registry, model_name, ref.read(), prepared.features.read(), champion=champion)
    return ChampionComparison(champion_version=champion.version, champion_value=value)


def write_report(markdown: str, out_dir: Path) -> Path:
    """Write ``report.md`` into the run's report folder."""
    path = out_dir / "report.md"
    path.write_text(markdown)
    return path


@task(name="publish-report", cache_policy=NONE)
def publish_report(markdown: str, out_dir: Path, key: str, description: str) -> Path:
    """Write ``report.md`` into the run's report folder and publish it as an artifact."""
    path = write_report(markdown, out_dir)
    publish_eval_report_task(markdown, key=key, description=description)
    return path


# ------------------------------------------------------------------------------------
# adapting a registered model


@task(name="resolve-model", cache_policy=NONE)
def resolve_model(spec: str) -> ModelRef:
    """One exact registered version from ``NAME[:VERSION|@alias]`` (the champion by default)."""
    return ModelRegistry().resolve(spec)


@task(name="load-for-fine-tuning", cache_policy=NONE)
def load_for_finetuning(parent: ModelRef) -> tuple[FraudSequenceModel, FraudPreprocessor, SequenceModelConfig]:
    """The parent's network in training mode, its preprocessor and sequence settings."""
    if parent.kind == CA.KINDS[CA.BASELINE]:
        raise DataValidationError(f"{parent.spec} is the gradient-boosting baseline (kind {parent.kind}): adapt "
                                  "fine-tunes a sequence model; pass --model NAME:VERSION of a sequence or ensemble version")
    model, pre, cfg = P.model_from_params(parent.params, ModelRegistry().load_state_dict(parent))
    model.train()
    return model, pre, cfg


@task(name="rescore-parent", cache_policy=NONE)
def rescore_parent(parent: ModelRef, new: DatasetRef, new_features: PreparedFeatures,
                   old: DatasetRef, old_features: PreparedFeatures) -> SC.AdaptScores:
    """The parent as registered, scored on both test periods."""
    return SC.parent_test_scores(parent, ModelRegistry(), (new.read(), new_features.features.read()),
                                 (old.read(), old_features.features.read()))


@task(name="score-adapted", cache_policy=NONE)
def score_adapted(model: FraudSequenceModel, setup: P.SequenceSetup, pre: FraudPreprocessor,
                  cfg: SequenceModelConfig, new: DatasetRef, new_features: PreparedFeatures,
                  old: DatasetRef, old_features: PreparedFeatures) -> SC.AdaptScores:
    """The fine-tuned model scored on both test periods."""
    return SC.adapted_test_scores(model, setup, pre, cfg, (new.read(), new_features.features.read()),
                                  (old.read(), old_features.features.read()))


@task(name="evaluate-stage", cache_policy=NONE)
def evaluate_stage(stage: str, scores: SC.AdaptScores, threshold: float, fpr_target: float) -> StageReports:
    """Metrics of one stage (before/after) on the new data, its new pattern and the old data."""

    def report(what: str, y: Any, s: Any) -> EvalReport:
        return evaluate_binary(y, s, name=f"{stage} ({what})", split="test", threshold=threshold, fpr_target=fpr_target)

    keep = scores.pattern
    return StageReports(
        new=report("new data", scores.y_new, scores.s_new),
        pattern=report("new pattern", scores.y_new[keep], scores.s_new[keep]) if keep is not None else None,
        old=report("old test", scores.y_old, scores.s_old),
    )


def adapt_train_spec(parent: ModelRef, prepared: PreparedFeatures, fraction: float, max_epochs: int, seed: int,
                     *, fresh: bool, hardware: TrainerArgs | None) -> TrainSpec:
    """How to fine-tune; the run key follows the parent, the data and the budget."""
    key = {"parent": parent.spec, "data": prepared.features.content_hash, "fraction": fraction, "epochs": max_epochs}
    return TrainSpec(run_key="fraud-adapt-" + stable_hash(key), max_epochs=max_epochs, patience=3,
                     monitor=OBJECTIVE, mode="max", seed=seed, fresh=fresh, hardware=hardware)


@task(name="adapted-params", cache_policy=NONE)
def adapted_params(parent: ModelRef, model: FraudSequenceModel, setup: P.SequenceSetup, ref: DatasetRef,
                   prepared: PreparedFeatures, fraction: float, freeze: Any) -> dict[str, Any]:
    """The parent's parameters with a threshold re-chosen on the new validation period
    and the fine-tuning budget."""
    fallback = float(parent.params.get("threshold", 0.5))
    y_val = SC.period_labels(ref.read(), prepared.features.read(), "val")
    params = dict(parent.params)
    params["threshold"] = val_threshold(y_val, P.score_period(model, setup, "val"), fallback)
    params["finetune"] = {"fraction": fraction, "trainable_params": freeze.trainable_params,
                          "total_params": freeze.total_params}
    return params


# ------------------------------------------------------------------------------------
# scoring


@dataclass(frozen=True)
class ScoringModel:
    """A registered version ready to score: its network (fp32 or a compressed variant),
    preprocessor and sequence settings."""

    ref: ModelRef
    net: Any
    preprocessor: FraudPreprocessor | None
    config: SequenceModelConfig | None
    baseline: CA.StoredBaseline | None = None


def load_scoring_model(model_ref: ModelRef, registry: ModelRegistry | None = None) -> ScoringModel:
    """Load a version for scoring (an INT8 / pruned / distilled variant through ``load_variant``)."""
    registry = registry or ModelRegistry()
    baseline = CA.load_baseline(model_ref)  # the GBM of a GBM or ensemble version (skops, allow-listed)
    if model_ref.kind == CA.KINDS[CA.BASELINE]:
        return ScoringModel(ref=model_ref, net=None, preprocessor=None, config=None, baseline=baseline)
    if "compression" in model_ref.params:
        net = load_variant(model_ref, registry, build_module)
        pre, cfg = P.preprocessing_from_params(model_ref.params)
    else:
        net, pre, cfg = P.model_from_params(model_ref.params, registry.load_state_dict(model_ref))
    return ScoringModel(ref=model_ref, net=net, preprocessor=pre, config=cfg, baseline=baseline)


load_scoring_model_task = task(load_scoring_model, name="load-model", cache_policy=NONE)


def score_file(model: ScoringModel, ref: DatasetRef, since: str | None = None) -> SC.ScoredTransactions:
    """Score the validated transactions of ``ref`` (rows before ``since`` are history only)."""
    return SC.score_transactions(model.net, model.preprocessor, model.config, model.ref, ref.read(),
                                 source=ref.source, since=since, baseline=model.baseline)


score_file_task = task(score_file, name="score-transactions", cache_policy=NONE)


def score_file_name(data: str, model_ref: ModelRef) -> str:
    """``<input stem>-<model>-v<version>.parquet``."""
    return f"{safe_stem(data)}-{model_ref.name}-v{model_ref.version}.parquet"


@task(name="write-scores", cache_policy=NONE)
def write_scores(scored: SC.ScoredTransactions, target: Path, csv: bool) -> Path | None:
    """Write the scores table (Parquet, and CSV on request); returns the CSV path."""
    return write_table(scored.table, target, csv)


@task(name="evaluate-labelled", cache_policy=NONE)
def evaluate_labelled(scored: SC.ScoredTransactions, name: str) -> EvalReport | None:
    """Metrics of the scored rows whose label is known (None without both classes)."""
    part = SC.labelled_part(scored)
    if part is None:
        return None
    return evaluate_binary(part[0], part[1], name=name, split="scored", threshold=scored.threshold)


def scoring_model_at(model_ref: ModelRef) -> ScoringModel:
    """Load a version for scoring from its own folder (its registry is the folder above it),
    whatever this worker's home is."""
    return load_scoring_model(model_ref, ModelRegistry(Path(model_ref.path).parents[1]))


def read_transactions(path: Path, columns: Mapping[str, str], accounts: str | None,
                      encoding: str | None = None) -> pd.DataFrame:
    """Read, map and validate a transactions file in memory (and join the accounts table)."""
    raw = read_table(path, encoding)
    mapping = ColumnMapping(dict(columns))
    table = validate_table(mapping.apply(raw) if mapping.columns else raw, transaction_schema(for_scoring=True),
                           source=str(path))
    if accounts:
        acc_path = Path(accounts).expanduser()
        table = P.merge_accounts(table, validate_table(read_table(acc_path, encoding), accounts_schema(),
                                                       source=str(acc_path)))
    return table


def batch_history_sources(ref: ModelRef) -> list[Path]:
    """Where a batch file's history comes from: the version's own training table (when this
    machine holds it) and the files the batch job scored before (:mod:`solutions.fraud.history`)."""
    own = sorted(home_layout().datasets().glob(f"*-{ref.data_hash}.parquet")) if ref.data_hash else []
    return [*own[:1], home_layout().batch_history("fraud")]


def score_inbox_file(file: InboxFile, *, model: ModelRef, columns: dict[str, str], accounts: str | None,
                     out_dir: str, csv: bool, encoding: str | None = None) -> ScoredFile:
    """Score one inbox file with the exact version the flow resolved (plain: runs on any
    task-runner worker, loads the model once per worker, reads the file once, hashes nothing).

    Any error while reading or validating the file is the file's (quarantined); not reaching
    the model, permissions and disk errors are the machine's (the file is retried).
    """
    scorer = load_once(model, scoring_model_at)
    with reading_content(file.shown):
        table = read_transactions(Path(file.path), columns, accounts, encoding)
    history = H.history_before(table, batch_history_sources(scorer.ref), SC.label_delay_days(scorer.ref))
    joined, since = H.with_history(table, history)
    if since is not None:
        log.info("%s: %d row(s) scored after %d row(s) of history", safe_stem(file.path), len(table), len(history))
    scored = SC.score_transactions(scorer.net, scorer.preprocessor, scorer.config, scorer.ref, joined,
                                   source=file.shown, since=since, baseline=scorer.baseline)
    H.record_scored(home_layout().batch_history("fraud"), file.sha256[:16], table)
    name = f"{safe_stem(file.path)}-{file.sha256[:12]}-{scorer.ref.name}-v{scorer.ref.version}.parquet"
    target = Path(out_dir) / name
    write_table(scored.table, target, csv)
    M.monitored_features(table).to_parquet(M.features_beside(target), index=False)  # for the drift check
    return ScoredFile(output=str(target), rows=len(scored.table), model=scorer.ref.spec, flagged=scored.flagged)


# ------------------------------------------------------------------------------------
# tuning


def fraud_space(base: SequenceModelConfig) -> tuple[Param, ...]:
    """The fraud search space (``SEARCH_SPACE``), checked against :class:`SequenceModelConfig`."""
    return validate_space(
        SEARCH_SPACE,
        fields=tuple(SequenceModelConfig.model_fields),
        make_config=lambda update: SequenceModelConfig(**{**base.model_dump(), **update}),
    )


def study_for(tune: TuneConfig, prepared: PreparedFeatures, base: SequenceModelConfig,
              space: tuple[Param, ...]) -> StudyRef:
    """The study: the given name, or one derived from the data, the fixed settings and the space."""
    tuned = {p.name for p in space}
    name = tune.study or "fraud-" + stable_hash({
        "data": prepared.features.content_hash,
        "fixed": {k: v for k, v in base.model_dump().items() if k not in tuned},
        "space": [p.model_dump() for p in space],
    })
    return StudyRef(name=check_name(name, "study name"), storage=storage_url(name), direction="maximize")


@dataclass(frozen=True)
class SequenceObjective:
    """One tuning trial: train the sequence model with the trial's parameters; return the
    best validation PR-AUC. Holds references only, so it travels to any worker. The trial trains
    through the task ``train-model`` (cached on its run key), so the final training of the best
    trial's run key is Cached, not trained again."""

    ref: DatasetRef
    prepared: PreparedFeatures
    base: SequenceModelConfig
    hardware: TrainerArgs | None = None

    def config(self, params: Mapping[str, Any]) -> SequenceModelConfig:
        """The base config with the trial's parameters."""
        return SequenceModelConfig(**{**self.base.model_dump(), **params})

    def __call__(self, params: dict[str, Any], run_key: str, callbacks: list[Any]) -> float | None:
        cfg = self.config(params)
        model, setup = self.build(cfg)
        spec = TrainSpec(run_key=run_key, max_epochs=cfg.max_epochs, patience=cfg.patience,
                         monitor=OBJECTIVE, mode="max", seed=cfg.seed, hardware=self.hardware)
        return train_model_task(model, setup.datamodule, spec, callbacks=callbacks).best_score

    def build(self, cfg: SequenceModelConfig) -> tuple[FraudSequenceModel, P.SequenceSetup]:
        """A fresh model and its data module for ``cfg``; the class weight uses every
        legit row (as the trials always did)."""
        df, feats = self.ref.read(), self.prepared.features.read()
        setup = P.sequence_setup(df, feats, cfg)
        return P.build_model(setup.preprocessor, cfg, SC.train_pos_weight(df, feats)), setup


@task(name="build-best-model", cache_policy=NONE)
def build_best_model(objective: SequenceObjective, best_params: Mapping[str, Any],
                     best_run_key: str) -> tuple[FraudSequenceModel, P.SequenceSetup, TrainSpec]:
    """The best trial's model, data module and train spec (its run key: training it again is
    Cached by Prefect and loads the trial's best checkpoint)."""
    cfg = objective.config(best_params)
    model, setup = objective.build(cfg)
    spec = TrainSpec(run_key=best_run_key, max_epochs=cfg.max_epochs, patience=cfg.patience,
                     monitor=OBJECTIVE, mode="max", seed=cfg.seed, hardware=objective.hardware)
    return model, setup, spec
