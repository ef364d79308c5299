"""``sensor-train``: fine-tune (or train from scratch), evaluate beside a baseline, register."""

from __future__ import annotations

import time

from prefect import flow

from flows.sensor import steps as st
from flows.sensor import training as T
from flows.sensor.results import SensorTrainResult
from solutions.sensor.config import SensorConfig, SensorSource
from solutions.sensor.data import window_config


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
    started = time.perf_counter()
    grid_ref, bad = st.obtain_grid(source, config)
    wcfg = window_config(source, config)
    # -- the encoder pre-trained on this data (pre-training it first if there is none), the windows
    encoder = T.encoder_for(source, config, grid_ref)
    setup = st.supervised_setup_step(grid_ref, config, wcfg, bad, encoder)
    blocks = st.validation_block_setups(grid_ref, config, wcfg, bad, setup)  # [setup] unless cross-fitting
    # -- the networks (every configured trunk; the best on validation) and the candidates beside the GBM
    net = T.train_networks(grid_ref, source, blocks, config, wcfg, encoder, fresh)
    cands = T.evaluate_candidates(net, blocks, config, wcfg)
    # -- the winner on validation registered with lineage, its card, the approval gate, the report
    registration = T.register_winner(grid_ref, source, config, wcfg, blocks, net, cands, strict)
    return T.publish_result(source, config, wcfg, grid_ref, setup, net, cands, registration,
                            time.perf_counter() - started)
