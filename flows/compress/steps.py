"""The compress flow's steps: thin tasks over the generic compression functions and an adapter."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel
from torch import nn

import tasks.compress as C
from flows.compress.params import CompressConfig
from flows.compress.results import CompressResult, render_candidates
from infra.compression import CompressTarget, ModelAdapter
from infra.registry import ModelRef, ModelRegistry
from infra.resources import TrainerArgs
from infra.sealed import discard_plaintext
from infra.store import stable_hash
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.train import TrainSpec, train_model_task

log = logging.getLogger(__name__)


@dataclass
class Variant:
    """A candidate that may be registered: its weights (a module or plain tensors), params and kind."""

    weights: nn.Module | dict[str, torch.Tensor]
    params: dict[str, Any]
    kind: str


@dataclass
class StageResult:
    """What a compression stage added: registrable variants and its reports."""

    variants: dict[str, Variant]
    layer_size: C.LayerSize | None = None
    sensitivity: list[C.SensitivityRow] = field(default_factory=list)
    prune: list[C.PruneReport] = field(default_factory=list)


@task(name="prepare-compress-target", cache_policy=NONE)
def prepare_target(ref: ModelRef, adapter: ModelAdapter, options: BaseModel) -> CompressTarget:
    """Load the registered model (no pickle) and let its adapter read the held-out data."""
    model = C.load_variant(ref, ModelRegistry(), adapter.build)
    return adapter.prepare(ref, model, options)


@task(name="evaluate-original", cache_policy=NONE)
def evaluate_original(target: CompressTarget, bench: C.Bench, atol: float) -> C.OnnxParity:
    """The fp32 original and its ONNX export (same graph, onnxruntime), checked against PyTorch."""
    fp32_path = bench.out / "fp32.safetensors"
    C.save_state(target.model.state_dict(), fp32_path)
    bench.add("fp32", "original", C.KIND_FP32, fp32_path, target.model)
    path, names = C.export_onnx(target.model, C.example_inputs(target, 2), bench.out / "fp32.onnx",
                                input_names=target.input_names)
    parity = C.check_onnx_parity(target.model, path, target.test_batches, names, atol=atol,
                                 metric=lambda out: target.metric(target.labels, out))
    if target.bench_inputs is not None:  # the latency batch too: more held-out rows than the metric's
        parity = C.merge_parity(parity, C.check_onnx_parity(target.model, path, [bench.batch], names, atol=atol))
    gpu_runner = None
    if bench.gpu:
        try:
            gpu_runner = C.onnx_runner(C.onnx_session(path, device="cuda"), bench.batch, names)
        except RuntimeError as exc:
            log.info("no ONNX GPU latency: %s", exc)
    bench.add("fp32-onnx", "export", "onnx", path, None, metric=parity.metric_onnx,
              cpu_runner=C.onnx_runner(C.onnx_session(path), bench.batch, names), gpu_runner=gpu_runner,
              note=f"onnxruntime; max abs diff {parity.max_abs_diff:.1e}")
    return parity


@task(name="evaluate-int8", cache_policy=NONE)
def int8_stage(target: CompressTarget, bench: C.Bench, params: dict[str, Any]) -> StageResult:
    """Dynamic INT8 and weight-only INT8 candidates."""
    qmodel = C.quantize_dynamic_int8(target.model)
    state = C.int8_state_dict(qmodel)
    path = bench.out / "int8-dynamic.safetensors"
    C.save_state(state, path)
    bench.add("int8-dynamic", "int8", C.KIND_INT8, path, qmodel, gpu_ok=False, params=C.param_count(target.model),
              note="CPU kernels; GPU n/a")
    wo_state = C.weight_only_int8_state(target.model)
    wo_path = bench.out / "int8-weight-only.safetensors"
    C.save_state(wo_state, wo_path)
    bench.add("int8-weight-only", "int8", C.KIND_INT8_WO, wo_path, C.load_weight_only_int8(target.model, wo_state),
              note="int8 on disk, fp32 compute")
    variants = {"int8-dynamic": Variant(state, params, C.KIND_INT8),
                "int8-weight-only": Variant(wo_state, params, C.KIND_INT8_WO)}
    return StageResult(variants, layer_size=C.quantized_layer_size(target.model, state))


def finetune(module: nn.Module, target: CompressTarget, run_key: str, epochs: int, hardware: TrainerArgs) -> nn.Module:
    """Train ``module`` further, in place: on its own loss, or on the adapter's ``loss_fn``."""
    if epochs <= 0:
        return module
    spec = TrainSpec(run_key=run_key, max_epochs=epochs, patience=max(1, epochs), monitor="val/loss", mode="min",
                     fresh=True, hardware=hardware)
    trainable = module if target.loss_fn is None else C.make_trainable(module, target.loss_fn, lr=target.lr)
    trainable.train()
    train_model_task(trainable, target.datamodule, spec)
    return module.cpu().eval()


@task(name="evaluate-pruning", cache_policy=NONE)
def pruning_stage(target: CompressTarget, bench: C.Bench, cfg: CompressConfig, ref: ModelRef,
                  hardware: TrainerArgs) -> StageResult:
    """Sensitivity analysis, structured pruning and global magnitude pruning (each fine-tuned)."""
    sens = C.sensitivity_analysis(target.model, lambda m: C.score(target, m), ratios=cfg.sensitivity_ratios,
                                  higher_is_better=target.higher_is_better, baseline=bench.base)
    key = stable_hash({"src": ref.spec, "ratio": cfg.prune_ratio, "epochs": cfg.finetune_epochs})
    if target.prune_plan is not None:
        structured, rep = C.prune_channels(target.model, cfg.prune_ratio, target.prune_plan)
    else:
        structured, rep = C.structured_prune(target.model, cfg.prune_ratio)
    structured = finetune(structured, target, f"compress-structured-{key}", cfg.finetune_epochs, hardware)
    path = bench.out / "pruned-structured.safetensors"
    C.save_state(structured.state_dict(), path)
    bench.add("pruned-structured", "pruning", C.KIND_FP32, path, structured,
              note=f"{cfg.prune_ratio:.0%} {target.prune_note}, then {cfg.finetune_epochs} fine-tuning epochs "
              "(extra training: compare with care)")
    keys = C.prunable_weights(target.model)
    sparse, rep2 = C.global_magnitude_prune(target.model, cfg.prune_ratio, keys, keep_masks=cfg.finetune_epochs > 0)
    sparse = C.finalize_pruning(finetune(sparse, target, f"compress-global-{key}", cfg.finetune_epochs, hardware))
    rep2 = rep2.model_copy(update={"zero_fraction": C.zero_fraction(sparse, keys)})
    path = bench.out / "pruned-global.safetensors"
    C.save_state(sparse.state_dict(), path)
    bench.add("pruned-global", "pruning", C.KIND_FP32, path, sparse,
              note=f"{rep2.zero_fraction:.0%} zeros; dense storage: no size or speed gain")
    variants = {"pruned-structured": Variant(structured, ref.params, C.KIND_FP32),
                "pruned-global": Variant(sparse, ref.params, C.KIND_FP32)}
    return StageResult(variants, sensitivity=sens, prune=[rep, rep2])


@task(name="evaluate-distillation", cache_policy=NONE)
def distill_stage(target: CompressTarget, bench: C.Bench, cfg: CompressConfig, ref: ModelRef,
                  hardware: TrainerArgs) -> StageResult:
    """Train a smaller student on the teacher's soft labels plus the hard labels."""
    if target.make_student is None:
        log.info("no student defined for this model type; distillation skipped")
        return StageResult({})
    student, params = target.make_student()
    losses: dict[str, Any] = {}
    if target.loss_fn is not None:
        losses = {"hard_loss": target.loss_fn, "soft_loss": target.soft_loss, "lr": target.lr}
    distiller = C.make_distiller(student, target.model, temperature=cfg.temperature, alpha=cfg.alpha,
                                 label_key=target.label_key, pos_weight=target.pos_weight, **losses)
    key = stable_hash({"src": ref.spec, "T": cfg.temperature, "a": cfg.alpha, "e": cfg.distill_epochs,
                       "hp": params.get("hparams")})
    spec = TrainSpec(run_key=f"compress-distill-{key}", max_epochs=cfg.distill_epochs, patience=3,
                     monitor="val/loss", mode="min", fresh=True, hardware=hardware)
    train_model_task(distiller, target.datamodule, spec)
    student = distiller.student.cpu().eval()
    path = bench.out / "distilled.safetensors"
    C.save_state(student.state_dict(), path)
    bench.add("distilled", "distillation", C.KIND_FP32, path, student,
              note=f"student, T={cfg.temperature:g}, alpha={cfg.alpha:g}, {cfg.distill_epochs} epochs")
    return StageResult({"distilled": Variant(student, params, C.KIND_FP32)})


@task(name="register-variant", cache_policy=NONE)
def register_variant(ref: ModelRef, target: CompressTarget, chosen: C.Candidate, variant: Variant,
                     base: float, cfg: CompressConfig, out_dir: Path) -> ModelRef:
    """Register the chosen candidate as ``<name>-<method>`` with lineage (an fp32 graph ships its ONNX too)."""
    weights = variant.weights
    extra: dict[str, Path] = {}
    if variant.kind == C.KIND_FP32 and isinstance(weights, nn.Module):
        path, names = C.export_onnx(weights, C.example_inputs(target, 2), out_dir / f"{chosen.name}.onnx",
                                    input_names=target.input_names)
        if C.check_onnx_parity(weights, path, target.test_batches, names, atol=cfg.onnx_atol).passed:
            extra["model.onnx"] = path
    slug = {"int8-dynamic": "int8", "int8-weight-only": "int8wo"}.get(chosen.name, chosen.name)
    compression = {"method": chosen.name, "source": ref.spec, "tolerance": cfg.tolerance,
                   "data": target.data_note, "data_hash": target.data_hash}
    return ModelRegistry().register(
        f"{ref.name}-{slug}", weights.state_dict() if isinstance(weights, nn.Module) else weights,
        params={**variant.params, "compression": compression},
        metrics={**chosen.secondary, ref.primary_metric: chosen.metric, f"{ref.primary_metric}_source": base,
                 "size_bytes": float(chosen.size_bytes),
                 "latency_p50_ms_cpu": chosen.cpu.p50_ms if chosen.cpu else float("nan")},
        primary_metric=ref.primary_metric, higher_is_better=ref.higher_is_better,
        data_hash=ref.data_hash, parent=ref.spec, kind=variant.kind,
        tags={"compression": chosen.name, "source": ref.spec}, extra_files=extra,
    )


@task(name="discard-plain-candidates", cache_policy=NONE)
def discard_plain_candidates(out_dir: Path) -> int:
    """On an encrypted registry, delete the candidates' plaintext weight and ONNX files once measured
    (the registered variant is sealed in the registry); the report keeps their sizes."""
    gone = discard_plaintext(sorted(out_dir.rglob("*")))
    if gone:
        log.info("removed %d plaintext candidate files from %s (the registry is encrypted)", gone, out_dir)
    return gone


@task(name="publish-compress-report", cache_policy=NONE)
def publish_report(result: CompressResult, model_name: str) -> str:
    """Write ``report.md`` beside the candidates and publish it as the run's artifact."""
    markdown = render_candidates(result)
    (Path(result.report_dir) / "report.md").write_text(markdown)
    publish_eval_report_task(markdown, key=artifact_key(f"compress-{model_name}"),
                             description="Compression candidates")
    return markdown
