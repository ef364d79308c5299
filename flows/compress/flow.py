"""The ``model-compress`` flow: INT8, then pruning, then distillation; ONNX export; one table."""

from __future__ import annotations

import time

from prefect import flow

from flows.compress.adapters import adapter_for, options_for
from flows.compress.params import CompressConfig
from flows.compress.results import CompressResult
from flows.compress.steps import (
    discard_plain_candidates,
    distill_stage,
    evaluate_original,
    int8_stage,
    prepare_target,
    pruning_stage,
    publish_report,
    register_variant,
)
from infra.compute import resolve_training
from infra.hardware import set_cpu_threads
from infra.home import home_layout
from infra.registry import ModelRegistry
from solutions.fraud.config import FraudHeldOut
from solutions.sensor.config import SensorHeldOut
from tasks.cards import refresh_parent_card_task
from tasks.compress import Bench, choose_candidate

#: The flow's defaults (frozen models: one shared instance each).
DEFAULT_CONFIG = CompressConfig()
DEFAULT_FRAUD_DATA = FraudHeldOut()
DEFAULT_SENSOR_DATA = SensorHeldOut()


@flow(name="model-compress", log_prints=True)
def model_compress(
    model: str,
    config: CompressConfig = DEFAULT_CONFIG,
    fraud_data: FraudHeldOut = DEFAULT_FRAUD_DATA,
    sensor_data: SensorHeldOut = DEFAULT_SENSOR_DATA,
) -> CompressResult:
    """Compress a registered model progressively: INT8 first; if the primary metric drops by
    more than the tolerance, pruning (sensitivity analysis, structured and global, fine-tuned),
    then distillation. Every candidate is scored on the same held-out data as the original;
    the fp32 model is exported to ONNX and checked against PyTorch with onnxruntime. Publishes
    one candidates table and registers the smallest candidate within tolerance as a variant.

    Args:
        model: NAME[:VERSION|@alias] of a registered model (default version: the champion).
        config: how far to compress and what to try.
        fraud_data: held-out data of a fraud sequence model.
        sensor_data: held-out data of a sensor RUL model.
    """
    started = time.monotonic()
    hardware = resolve_training("model-compress")
    set_cpu_threads(hardware.num_threads)
    ref = ModelRegistry().resolve(model)
    adapter = adapter_for(ref)
    target = prepare_target(ref, adapter, options_for(adapter, fraud_data, sensor_data))
    out_dir = home_layout().new_report(f"compress-{ref.name}-v{ref.version}")
    bench = Bench(target, out_dir, tolerance=config.tolerance, latency_batch=config.latency_batch)
    # -- the original and its ONNX export (same graph, another runtime)
    parity = evaluate_original(target, bench, config.onnx_atol)
    # -- stage 1: INT8
    int8 = int8_stage(target, bench, ref.params)
    stages = [int8]
    # -- stage 2: pruning, only if INT8 lost too much
    if config.try_all or not bench.ok("int8"):
        stages.append(pruning_stage(target, bench, config, ref, hardware))
    # -- stage 3: distillation, only if pruning lost too much too
    if config.try_all or not (bench.ok("int8") or bench.ok("pruning")):
        stages.append(distill_stage(target, bench, config, ref, hardware))
    rows = bench.finish()
    # -- choose the smallest candidate within tolerance (then the fastest); register it
    chosen = choose_candidate(rows)
    variant = None
    if chosen is not None and config.register_variant:
        variants = {name: v for stage in stages for name, v in stage.variants.items()}
        variant = register_variant(ref, target, chosen, variants[chosen.name], bench.base, config, out_dir)
        refresh_parent_card_task(variant)  # the parent's model card lists its variants
    discard_plain_candidates(out_dir)  # an encrypted registry: no plaintext weights left in the report folder
    result = CompressResult(
        source=ref.spec, primary_metric=ref.primary_metric, higher_is_better=ref.higher_is_better,
        original_metric=bench.base, tolerance=config.tolerance, data_note=target.data_note, candidates=rows,
        int8_layers=int8.layer_size, onnx=parity, output_columns=target.output_columns,
        sensitivity=[r for s in stages for r in s.sensitivity], prune=[r for s in stages for r in s.prune],
        chosen=chosen.name if chosen else None, variant=variant, report_dir=str(out_dir),
        seconds=time.monotonic() - started,
    )
    publish_report(result, ref.name)
    return result
