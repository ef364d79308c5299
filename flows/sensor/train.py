"""``sensor-train``: fine-tune (or train from scratch), evaluate beside a baseline, register."""

from __future__ import annotations

import time

from prefect import flow

from flows.sensor import steps as st
from flows.sensor.governance import compare_with_champion, recompare_with, sensor_card, sensor_lineage
from flows.sensor.monitoring import profile_step
from flows.sensor.pretrain import sensor_pretrain
from flows.sensor.results import SensorTrainResult
from infra.home import home_layout
from infra.registry import ModelRef
from solutions.sensor import evaluate as E
from solutions.sensor import pipeline as P
from solutions.sensor.config import SensorConfig, SensorSource, WindowConfig
from solutions.sensor.data import window_config
from solutions.sensor.model import RULModel, SensorRULModel, WindowDataModule
from tasks.approval import approval_gate_task
from tasks.cards import as_comparison
from tasks.data import DatasetRef
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.finetune import FreezeReport, finetune_model_task
from tasks.monitoring import PROFILE_FILE
from tasks.register import register_model_task
from tasks.train import TrainResult, TrainSpec, train_model_task


def _train_cnn(model: SensorRULModel, dm: WindowDataModule, spec: TrainSpec, pretrained: bool,
               config: SensorConfig) -> tuple[TrainResult, FreezeReport | None]:
    """Fine-tune (from a pre-trained encoder) or train one CNN; its train result and freeze report."""
    ft = config.finetune
    if pretrained:
        tuned = finetune_model_task(model, dm, spec, mode=ft.mode, groups=P.unfreeze_groups(config),
                                    every_n_epochs=ft.unfreeze_every, unfrozen_lr_ratio=ft.unfrozen_lr_ratio)
        return tuned.train, tuned.freeze
    return train_model_task(model, dm, spec), None


def _train_network(grid_ref: DatasetRef, blocks: list[P.SupervisedSetup], config: SensorConfig, wcfg: WindowConfig,
                   encoder: ModelRef | None, fresh: bool,
                   ) -> tuple[RULModel, TrainResult, FreezeReport | None, TrainSpec, st.OutOfFold | None]:
    """Train the network of ``config.model`` (its trunk) and, with ``members`` > 1, its seed
    ensemble, member ``i`` on the windows of validation block ``i % len(blocks)``; the model, the
    first member's train result, freeze report and spec, and (cross-fitted: two blocks or more) the
    members' out-of-fold validation predictions."""
    model, dm = st.new_predictor_step(blocks[0], config, wcfg, encoder)
    spec = st.train_spec(grid_ref, encoder, config, wcfg, fresh)
    trained, freeze = _train_cnn(model, dm, spec, encoder is not None, config)
    if config.finetune.members > 1:  # a seed ensemble: more CNNs from the next seeds (cross-fitted: other blocks)
        members = [model]
        for i in range(1, config.finetune.members):
            member_cfg = P.member_config(config, i)
            member, member_dm = st.new_predictor_step(blocks[i % len(blocks)], member_cfg, wcfg, encoder)
            _train_cnn(member, member_dm, st.train_spec(grid_ref, encoder, member_cfg, wcfg, fresh),
                       encoder is not None, member_cfg)
            members.append(member)
        oof = st.OutOfFold.of(blocks, members) if len(blocks) > 1 else None
        return st.ensemble_step(members), trained, freeze, spec, oof
    return model, trained, freeze, spec, None


@flow(name="sensor-train", log_prints=True)
def sensor_train(
    source: SensorSource = SensorSource(),  # noqa: B008 - a frozen typed default renders a UI form
    config: SensorConfig = SensorConfig(),  # noqa: B008 - a frozen typed default renders a UI form
    fresh: bool = False,
    strict: bool = False,
) -> SensorTrainResult:
    """Fine-tune the pre-trained encoder with RUL and failure-within-horizon heads on the
    labelled share of the training assets (or train from scratch), evaluate it beside a
    gradient-boosting baseline on the same test assets, register it and promote it if its
    test RMSE beats the champion's. Pre-trains first when no encoder fits the data.

    Args:
        source: the input data (default: the seeded synthetic fleet).
        config: settings of the sensor vertical.
        fresh: retrain even if this run's checkpoints exist.
        strict: fail (QualityGateError) if the new version does not beat the champion.
    """
    started, ft = time.perf_counter(), config.finetune
    grid_ref, bad = st.obtain_grid(source, config)
    wcfg = window_config(source, config)
    # -- encoder: the one pre-trained on this data, pre-training it first if there is none
    encoder = st.find_encoder_step(config.encoder_name, grid_ref.content_hash, config.model) if ft.pretrained else None
    if ft.pretrained and encoder is None:
        encoder = sensor_pretrain(source, config).model
    # -- labelled windows, model, training
    setup = st.supervised_setup_step(grid_ref, config, wcfg, bad, encoder)
    blocks = st.validation_block_setups(grid_ref, config, wcfg, bad, setup)  # [setup] unless cross-fitting
    model, trained, freeze, spec, oof = _train_network(grid_ref, blocks, config, wcfg, encoder, fresh)
    # -- other encoder trunks (extra_archs), each trained alike; the best on validation is the network
    nets = {config.model.arch: (model, trained, freeze, spec, oof, encoder)}
    for arch in dict.fromkeys(a for a in config.extra_archs if a != config.model.arch):
        arch_cfg = config.model_copy(update={"model": config.model.model_copy(update={"arch": arch})})
        arch_encoder = st.find_encoder_step(config.encoder_name, grid_ref.content_hash, arch_cfg.model) \
            if ft.pretrained else None
        if ft.pretrained and arch_encoder is None:
            arch_encoder = sensor_pretrain(source, arch_cfg).model
        nets[arch] = (*_train_network(grid_ref, blocks, arch_cfg, wcfg, arch_encoder, fresh), arch_encoder)
    network_val = None
    if len(nets) > 1:
        best, network_val = st.choose_network_step(
            {a: n[0] for a, n in nets.items()}, setup.data,
            {a: n[4] for a, n in nets.items()} if all(n[4] is not None for n in nets.values()) else None)
        model, trained, freeze, spec, oof, encoder = nets[best]
    # -- evaluate the CNN and the baseline on the same test assets
    out_dir = home_layout().new_report("sensor-train")
    cnn_pred = st.predict_cnn_step(model, setup.data)
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
    # -- the candidates compared on the validation assets; the winner is registered
    choice = st.choose_candidate_step(model, baseline, setup.data, network_val, oof)
    candidates = {"cnn": cnn_pred, **({"baseline": base_pred} if base_pred else {})}
    if choice.winner == "ensemble":
        candidates["ensemble"] = st.ensemble_predictions(cnn_pred, base_pred)
    winner_pred = candidates[choice.winner]
    winner = {"cnn": cnn, "baseline": base}.get(choice.winner) or st.evaluate_step(
        "ensemble", setup.data, winner_pred, None, wcfg.horizon, out_dir,
        calibrate=st.calibration_set("ensemble", oof, baseline))
    winning = st.winner_registration_step(choice, model, baseline, out_dir)
    # -- register with lineage; the champion rule compares the champion re-scored on the same
    #    test cuts (compare-and-swap), then the model card
    champion = compare_with_champion(config.model_name, setup.data, winner_pred)
    lineage = sensor_lineage(grid_ref, source, config, setup, encoder, spec.hardware, trained)
    registration = register_model_task(
        config.model_name, winning.module, kind=winning.kind,
        extra_files={**winning.extra_files, PROFILE_FILE: profile_step(grid_ref, setup, winner_pred.rul_last, out_dir)},
        params=P.model_params(model, setup.normalizer, wcfg, threshold=winner.threshold,
                              label_fraction=ft.label_fraction, split=config.split.model_dump(),
                              encoder=encoder.spec if encoder else None, **winning.params),
        metrics={**st.train_metrics(winner, base), **choice.metrics()}, primary_metric=P.PRIMARY_METRIC,
        higher_is_better=False,
        data_hash=grid_ref.content_hash, parent=encoder.spec if encoder else None,
        comparison=as_comparison(champion), recompare=recompare_with(config.model_name, setup.data, winner_pred),
        lineage=lineage, strict=strict,
    )
    chosen_on = (f"{choice.val_assets} validation assets in {len(blocks)} disjoint blocks, each scored by the "
                 "models that did not train on it (cross-fitted); the alert threshold is calibrated on every "
                 "window of those blocks, out of fold" if choice.val_assets is not None else
                 f"{len(setup.splits['val'])} validation assets")
    sensor_card(registration, source, setup, choice.winner, candidates, champion, chosen_on)
    registration = approval_gate_task(registration, strict=strict)  # a model that needs approval waits here
    markdown = st.train_report_step(f"sensor-train: RUL, {source.describe()}", cnn, base, wcfg.horizon, setup.report,
                                    registration.decision, images, out_dir)
    publish_eval_report_task(markdown, key=artifact_key("sensor-train-report"), description="RUL / failure model vs baseline")
    return SensorTrainResult(
        dataset=grid_ref, bad_readings=setup.report, pretrained_from=encoder.spec if encoder else None,
        label_fraction=ft.label_fraction, labelled_assets=len(setup.labelled),
        assets={k: len(v) for k, v in setup.splits.items()}, windows=setup.data.window_counts(),
        train=trained, freeze=freeze, rul=cnn.rul, baseline_rul=base.rul if base else None, failure=cnn.failure,
        baseline_failure=base.failure if base else None, alerts=cnn.alerts, threshold=cnn.threshold,
        winner=choice.winner, model=registration.model,
        promotion=registration.decision, report_dir=str(out_dir), seconds=time.perf_counter() - started,
    )
