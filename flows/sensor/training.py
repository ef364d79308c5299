"""The stages of ``sensor-train``, each a few steps: the networks, the candidates, the registration.

The flow body (``flows/sensor/train.py``) only calls these in order. Each stage is a plain
function that runs the steps of ``flows.sensor.steps`` and the generic tasks (inside the flow's
run, so the Prefect UI shows every step) and returns a small typed result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flows.sensor import steps as st
from flows.sensor.governance import compare_with_champion, recompare_with, sensor_card, sensor_lineage
from flows.sensor.monitoring import profile_step
from flows.sensor.pretrain import sensor_pretrain
from flows.sensor.results import SensorTrainResult
from infra.home import home_layout
from infra.registry import ModelRef
from solutions.sensor import candidates as CA
from solutions.sensor import evaluate as E
from solutions.sensor import pipeline as P
from solutions.sensor.config import SensorConfig, SensorSource, WindowConfig
from solutions.sensor.model import RULModel, SensorRULModel, WindowDataModule
from tasks.approval import approval_gate_task
from tasks.cards import as_comparison
from tasks.data import DatasetRef
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.finetune import FreezeReport, finetune_model_task
from tasks.monitoring import PROFILE_FILE
from tasks.register import RegistrationResult, register_model_task
from tasks.train import TrainResult, TrainSpec, train_model_task


@dataclass
class NetworkRun:
    """The network (the best trunk on validation) and how it was trained."""

    model: RULModel
    trained: TrainResult
    freeze: FreezeReport | None
    spec: TrainSpec
    oof: st.OutOfFold | None  # cross-fitted: the members' out-of-fold validation predictions
    encoder: ModelRef | None
    network_val: dict[str, float] | None = None  # each trunk's validation RMSE, when several were trained


@dataclass
class Candidates:
    """The candidates on the test protocol, their evaluations and the one chosen on validation."""

    choice: CA.SensorChoice
    baseline: st.BaselineCandidate | None
    cnn: st.ModelEvaluation
    base: st.ModelEvaluation | None
    winner: st.ModelEvaluation
    predictions: dict[str, E.TestPredictions]
    images: list[Path]
    out_dir: Path

    @property
    def winner_predictions(self) -> E.TestPredictions:
        return self.predictions[self.choice.winner]


def encoder_for(source: SensorSource, config: SensorConfig, grid_ref: DatasetRef) -> ModelRef | None:
    """The encoder pre-trained on this data for ``config.model``'s trunk, pre-training one first
    when there is none (None when fine-tuning from a pre-trained encoder is off)."""
    if not config.finetune.pretrained:
        return None
    encoder = st.find_encoder_step(config.encoder_name, grid_ref.content_hash, config.model)
    return encoder if encoder is not None else sensor_pretrain(source, config).model


def _train_cnn(model: SensorRULModel, dm: WindowDataModule, spec: TrainSpec, pretrained: bool,
               config: SensorConfig) -> tuple[TrainResult, FreezeReport | None]:
    """Fine-tune (from a pre-trained encoder) or train one CNN; its train result and freeze report."""
    ft = config.finetune
    if pretrained:
        tuned = finetune_model_task(model, dm, spec, mode=ft.mode, groups=P.unfreeze_groups(config),
                                    every_n_epochs=ft.unfreeze_every, unfrozen_lr_ratio=ft.unfrozen_lr_ratio)
        return tuned.train, tuned.freeze
    return train_model_task(model, dm, spec), None


def train_network(grid_ref: DatasetRef, blocks: list[P.SupervisedSetup], config: SensorConfig, wcfg: WindowConfig,
                  encoder: ModelRef | None, fresh: bool) -> NetworkRun:
    """Train the network of ``config.model`` (its trunk) and, with ``members`` > 1, its seed
    ensemble, member ``i`` on the windows of validation block ``i % len(blocks)``; cross-fitted
    (two blocks or more), the members' out-of-fold validation predictions too."""
    model, dm = st.new_predictor_step(blocks[0], config, wcfg, encoder)
    spec = st.train_spec(grid_ref, encoder, config, wcfg, fresh)
    trained, freeze = _train_cnn(model, dm, spec, encoder is not None, config)
    if config.finetune.members <= 1:
        return NetworkRun(model, trained, freeze, spec, None, encoder)
    members = [model]  # a seed ensemble: more CNNs from the next seeds (cross-fitted: other blocks)
    for i in range(1, config.finetune.members):
        member_cfg = P.member_config(config, i)
        member, member_dm = st.new_predictor_step(blocks[i % len(blocks)], member_cfg, wcfg, encoder)
        _train_cnn(member, member_dm, st.train_spec(grid_ref, encoder, member_cfg, wcfg, fresh),
                   encoder is not None, member_cfg)
        members.append(member)
    oof = st.OutOfFold.of(blocks, members) if len(blocks) > 1 else None
    return NetworkRun(st.ensemble_step(members), trained, freeze, spec, oof, encoder)


def train_networks(grid_ref: DatasetRef, source: SensorSource, blocks: list[P.SupervisedSetup], config: SensorConfig,
                   wcfg: WindowConfig, encoder: ModelRef | None, fresh: bool) -> NetworkRun:
    """The configured trunk (from ``encoder``, the one the windows were normalised for) and every
    other of ``config.extra_archs``, each trained alike from its own pre-trained encoder; the best
    on validation is the network candidate."""
    nets = {config.model.arch: train_network(grid_ref, blocks, config, wcfg, encoder, fresh)}
    for arch in dict.fromkeys(a for a in config.extra_archs if a != config.model.arch):
        arch_cfg = config.model_copy(update={"model": config.model.model_copy(update={"arch": arch})})
        nets[arch] = train_network(grid_ref, blocks, arch_cfg, wcfg, encoder_for(source, arch_cfg, grid_ref), fresh)
    if len(nets) == 1:
        return nets[config.model.arch]
    oofs = {a: n.oof for a, n in nets.items()}
    best, network_val = st.choose_network_step({a: n.model for a, n in nets.items()}, blocks[0].data,
                                               oofs if all(o is not None for o in oofs.values()) else None)
    nets[best].network_val = network_val
    return nets[best]


def evaluate_candidates(net: NetworkRun, blocks: list[P.SupervisedSetup], config: SensorConfig,
                        wcfg: WindowConfig) -> Candidates:
    """The network and the GBM on the same test assets, their mean when it is chosen; the winner
    on validation (cross-fitted: every block's out-of-fold predictions) and its evaluation."""
    setup, oof, ft = blocks[0], net.oof, config.finetune
    out_dir = home_layout().new_report("sensor-train")
    cnn_pred = st.predict_cnn_step(net.model, setup.data)
    baseline = st.baseline_candidate_step(setup.data, ft.seed, blocks if oof is not None else None) \
        if config.baseline else None
    # thresholds: max F1 on validation; cross-fitted, on every block's out-of-fold P(failure)
    cnn = st.evaluate_step("cnn", setup.data, cnn_pred, ft.alert_threshold, wcfg.horizon, out_dir,
                           calibrate=st.calibration_set("cnn", oof, baseline))
    base_pred = baseline.predictions if baseline else None
    base = st.evaluate_step(E.BASELINE_NAME, setup.data, base_pred, None, wcfg.horizon, out_dir,
                            failure_name="baseline", calibrate=st.calibration_set("baseline", oof, baseline)) \
        if base_pred else None
    images = st.plot_rul_step(setup.data, cnn_pred, base_pred, out_dir)
    choice = st.choose_candidate_step(net.model, baseline, setup.data, net.network_val, oof)
    predictions = {CA.CNN: cnn_pred, **({CA.BASELINE: base_pred} if base_pred else {})}
    # the two blended: the mean (ensemble), or the stack's weights fitted out of fold
    weights = (choice.stack[CA.CNN], choice.stack[CA.BASELINE]) if choice.winner == CA.STACK else (0.5, 0.5)
    if choice.winner in (CA.ENSEMBLE, CA.STACK):
        predictions[choice.winner] = st.ensemble_predictions(cnn_pred, base_pred, weights)
    winner = {CA.CNN: cnn, CA.BASELINE: base}.get(choice.winner) or st.evaluate_step(
        choice.winner, setup.data, predictions[choice.winner], None, wcfg.horizon, out_dir,
        calibrate=st.calibration_set(choice.winner, oof, baseline, weights))
    return Candidates(choice, baseline, cnn, base, winner, predictions, images, out_dir)


def register_winner(grid_ref: DatasetRef, source: SensorSource, config: SensorConfig, wcfg: WindowConfig,
                    blocks: list[P.SupervisedSetup], net: NetworkRun, cands: Candidates,
                    strict: bool) -> RegistrationResult:
    """Register the winner with lineage (the champion rule compares the champion re-scored on the
    same test cuts, compare-and-swap), write its model card and pass the approval gate."""
    setup, choice, pred = blocks[0], cands.choice, cands.winner_predictions
    winning = st.winner_registration_step(choice, net.model, cands.baseline, cands.out_dir)
    champion = compare_with_champion(config.model_name, setup.data, pred)
    lineage = sensor_lineage(grid_ref, source, config, setup, net.encoder, net.spec.hardware, net.trained)
    registration = register_model_task(
        config.model_name, winning.module, kind=winning.kind,
        extra_files={**winning.extra_files, PROFILE_FILE: profile_step(grid_ref, setup, pred.rul_last, cands.out_dir)},
        params=P.model_params(net.model, setup.normalizer, wcfg, threshold=cands.winner.threshold,
                              label_fraction=config.finetune.label_fraction, split=config.split.model_dump(),
                              encoder=net.encoder.spec if net.encoder else None, **winning.params),
        metrics={**st.train_metrics(cands.winner, cands.base), **choice.metrics()}, primary_metric=P.PRIMARY_METRIC,
        higher_is_better=False, data_hash=grid_ref.content_hash, parent=net.encoder.spec if net.encoder else None,
        comparison=as_comparison(champion), recompare=recompare_with(config.model_name, setup.data, pred),
        lineage=lineage, strict=strict,
    )
    chosen_on = (f"{choice.val_assets} validation assets in {len(blocks)} disjoint blocks, each scored by the "
                 "models that did not train on it (cross-fitted); the alert threshold is calibrated on every "
                 "window of those blocks, out of fold" if choice.val_assets is not None else
                 f"{len(setup.splits['val'])} validation assets")
    sensor_card(registration, source, setup, choice.winner, cands.predictions, champion, chosen_on)
    return approval_gate_task(registration, strict=strict)  # a model that needs approval waits here


def publish_result(source: SensorSource, config: SensorConfig, wcfg: WindowConfig, grid_ref: DatasetRef,
                   setup: P.SupervisedSetup, net: NetworkRun, cands: Candidates, registration: RegistrationResult,
                   seconds: float) -> SensorTrainResult:
    """Publish the run's report (an artifact) and return what the run produced."""
    cnn, base = cands.cnn, cands.base
    markdown = st.train_report_step(f"sensor-train: RUL, {source.describe()}", cnn, base, wcfg.horizon, setup.report,
                                    registration.decision, cands.images, cands.out_dir)
    publish_eval_report_task(markdown, key=artifact_key("sensor-train-report"), description="RUL / failure model vs baseline")
    return SensorTrainResult(
        dataset=grid_ref, bad_readings=setup.report, pretrained_from=net.encoder.spec if net.encoder else None,
        label_fraction=config.finetune.label_fraction, labelled_assets=len(setup.labelled),
        assets={k: len(v) for k, v in setup.splits.items()}, windows=setup.data.window_counts(),
        train=net.trained, freeze=net.freeze, rul=cnn.rul, baseline_rul=base.rul if base else None,
        failure=cnn.failure, baseline_failure=base.failure if base else None, alerts=cnn.alerts,
        threshold=cnn.threshold, winner=cands.choice.winner, model=registration.model,
        promotion=registration.decision, report_dir=str(cands.out_dir), seconds=seconds,
    )
