"""``sensor-train``: fine-tune (or train from scratch), evaluate beside a baseline, register."""

from __future__ import annotations

import time

from prefect import flow

from flows.sensor import steps as st
from flows.sensor.monitoring import profile_step
from flows.sensor.pretrain import sensor_pretrain
from flows.sensor.results import SensorTrainResult
from infra.home import home_layout
from solutions.sensor import evaluate as E
from solutions.sensor import pipeline as P
from solutions.sensor.config import SensorConfig, SensorSource
from solutions.sensor.data import window_config
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.finetune import finetune_model_task
from tasks.monitoring import PROFILE_FILE
from tasks.register import register_model_task
from tasks.train import train_model_task


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
    encoder = st.find_encoder_step(config.encoder_name, grid_ref.content_hash) if ft.pretrained else None
    if ft.pretrained and encoder is None:
        encoder = sensor_pretrain(source, config).model
    # -- labelled windows, model, training
    setup = st.supervised_setup_step(grid_ref, config, wcfg, bad, encoder)
    model, dm = st.new_predictor_step(setup, config, wcfg, encoder)
    spec = st.train_spec(grid_ref, encoder, config, wcfg, fresh)
    freeze = None
    if encoder is not None:
        tuned = finetune_model_task(model, dm, spec, mode=ft.mode, groups=P.unfreeze_groups(config),
                                    every_n_epochs=ft.unfreeze_every)
        trained, freeze = tuned.train, tuned.freeze
    else:
        trained = train_model_task(model, dm, spec)
    # -- evaluate the CNN and the baseline on the same test assets
    out_dir = home_layout().new_report("sensor-train")
    cnn_pred = st.predict_cnn_step(model, setup.data)
    cnn = st.evaluate_step("cnn", setup.data, cnn_pred, ft.alert_threshold, wcfg.horizon, out_dir)
    base_pred = st.baseline_step(setup.data, ft.seed) if config.baseline else None
    base = st.evaluate_step(E.BASELINE_NAME, setup.data, base_pred, None, wcfg.horizon, out_dir,
                            failure_name="baseline") if base_pred else None
    images = st.plot_rul_step(setup.data, cnn_pred, base_pred, out_dir)
    # -- register; the champion rule compares the champion re-scored on the same test cuts
    registration = register_model_task(
        config.model_name, model,
        params=P.model_params(model, setup.normalizer, wcfg, threshold=cnn.threshold, label_fraction=ft.label_fraction,
                              split=config.split.model_dump(), encoder=encoder.spec if encoder else None),
        metrics=st.train_metrics(cnn, base), primary_metric=P.PRIMARY_METRIC, higher_is_better=False,
        data_hash=grid_ref.content_hash, parent=encoder.spec if encoder else None,
        champion_value=st.champion_rmse_step(config.model_name, setup.data), strict=strict,
        extra_files={PROFILE_FILE: profile_step(grid_ref, setup, cnn_pred.rul_last, out_dir)},
    )
    markdown = st.train_report_step(f"sensor-train: RUL, {source.describe()}", cnn, base, wcfg.horizon, setup.report,
                                    registration.decision, images, out_dir)
    publish_eval_report_task(markdown, key=artifact_key("sensor-train-report"), description="RUL / failure model vs baseline")
    return SensorTrainResult(
        dataset=grid_ref, bad_readings=setup.report, pretrained_from=encoder.spec if encoder else None,
        label_fraction=ft.label_fraction, labelled_assets=len(setup.labelled),
        assets={k: len(v) for k, v in setup.splits.items()}, windows=setup.data.window_counts(),
        train=trained, freeze=freeze, rul=cnn.rul, baseline_rul=base.rul if base else None, failure=cnn.failure,
        baseline_failure=base.failure if base else None, alerts=cnn.alerts, threshold=cnn.threshold,
        winner=E.winner(cnn.rul.rmse, base.rul.rmse if base else None), model=registration.model,
        promotion=registration.decision, report_dir=str(out_dir), seconds=time.perf_counter() - started,
    )
