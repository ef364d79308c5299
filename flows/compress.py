"""Compress a registered model: INT8, then pruning, then distillation; ONNX export; one table.

Run ``python -m flows.compress --model NAME[:VERSION] --help``. With ``--json`` the flow's
typed result is printed as one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from prefect import flow, task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

import tasks.compress as C
from flows._cli import add_common, parse_columns, run_command
from flows._compress_models import CompressTarget, adapter_for
from infra.hardware import set_cpu_threads
from infra.home import home_layout
from infra.registry import ModelRef, ModelRegistry
from infra.settings import get_train_settings
from infra.store import stable_hash
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.train import TrainSpec, train_model_task

log = logging.getLogger("flows.compress")  # not __main__ under python -m

#: Registry ``kind`` of each stored variant format.
from tasks.compress import KIND_FP32, KIND_INT8, KIND_INT8_WO  # noqa: E402


class CompressConfig(BaseModel):
    """How far to compress and what to try."""

    model_config = ConfigDict(frozen=True)

    tolerance: float = Field(default=0.01, ge=0, lt=1, description="Largest relative drop of the primary metric accepted.")
    try_all: bool = Field(default=False, description="Run every stage even when an earlier one is within tolerance.")
    sensitivity_ratios: tuple[float, ...] = Field(default=(0.3, 0.6, 0.9), description="Pruning ratios of the per-layer analysis.")
    prune_ratio: float = Field(
        default=0.5, gt=0, lt=1, description="Share of neurons / channels (structured) and of weights (global) removed."
    )
    finetune_epochs: int = Field(default=3, ge=0, description="Fine-tuning epochs after pruning (0: none).")
    distill_epochs: int = Field(default=5, ge=1, description="Student training epochs.")
    temperature: float = Field(default=4.0, gt=0, description="Distillation temperature.")
    alpha: float = Field(default=0.5, ge=0, le=1, description="Weight of the soft (teacher) loss.")
    latency_batch: int = Field(default=256, ge=1, description="Batch size of the latency measurement.")
    onnx_atol: float = Field(default=1e-4, gt=0, description="Largest ONNX vs PyTorch output difference accepted.")
    register_variant: bool = Field(default=True, description="Register the chosen candidate as a variant.")


class Candidate(BaseModel):
    """One row of the candidates table."""

    model_config = ConfigDict(frozen=True)

    name: str
    stage: str = Field(description="original, export, int8, pruning or distillation.")
    kind: str
    file: str
    size_bytes: int
    params: int
    cpu: C.Latency | None
    gpu: C.Latency | None = None
    metric: float
    delta: float = Field(description="Metric minus the original's.")
    rel_drop: float = Field(description="Relative drop (positive = worse, whichever way the metric points).")
    within_tolerance: bool
    note: str = ""
    secondary: dict[str, float] = Field(default_factory=dict, description="Other metrics (not used to choose).")


class CompressResult(BaseModel):
    """What ``model-compress`` produced."""

    model_config = ConfigDict(frozen=True)

    source: str
    primary_metric: str
    higher_is_better: bool = True
    original_metric: float
    tolerance: float
    data_note: str
    candidates: list[Candidate]
    int8_layers: C.LayerSize
    onnx: C.OnnxParity
    output_columns: list[str] = Field(default_factory=list, description="Names of the model output's columns.")
    sensitivity: list[C.SensitivityRow]
    prune: list[C.PruneReport]
    chosen: str | None
    variant: ModelRef | None
    report_dir: str
    seconds: float


# ------------------------------------------------------------------------------------
# helpers


def _latency_batch(target: CompressTarget, n: int) -> Any:
    first = target.test_batches[0] if target.bench_inputs is None else target.bench_inputs
    if isinstance(first, dict):
        return {k: v[:n] for k, v in first.items() if k in target.input_names}
    return first[:n]


def _rel_drop(value: float, base: float, higher_is_better: bool) -> float:
    sign = 1.0 if higher_is_better else -1.0
    return sign * (base - value) / abs(base) if base else 0.0


def _rel_change(delta: float, base: float) -> float:
    """The metric's relative change in percent (its sign is the metric's, not better / worse)."""
    return 100 * delta / abs(base) if base else 0.0


def _merge_parity(a: C.OnnxParity, b: C.OnnxParity) -> C.OnnxParity:
    """One parity record over two checks of the same ONNX file (the metric is ``a``'s)."""
    per = [max(x, y) for x, y in zip(a.max_abs_diff_per_output, b.max_abs_diff_per_output, strict=True)]
    return a.model_copy(update={
        "n": a.n + b.n, "max_abs_diff": max(a.max_abs_diff, b.max_abs_diff), "passed": a.passed and b.passed,
        "max_abs_diff_per_output": per,
    })


class _Bench:
    """Measures and records candidates against the original on the same data."""

    def __init__(self, target: CompressTarget, cfg: CompressConfig, out_dir: Path) -> None:
        self.t, self.cfg, self.out = target, cfg, out_dir
        self.batch = _latency_batch(target, cfg.latency_batch)
        self.gpu = torch.cuda.is_available()
        self.base: float | None = None
        self.rows: list[Candidate] = []
        self.cpu_runners: dict[str, Callable[[], Any] | None] = {}
        self.gpu_runners: dict[str, Callable[[], Any]] = {}

    def add(self, name: str, stage: str, kind: str, file: Path, module: nn.Module | None, *,
            metric: float | None = None, cpu_runner: Callable[[], Any] | None = None,
            gpu_runner: Callable[[], Any] | None = None, gpu_ok: bool = True, params: int | None = None,
            note: str = "") -> Candidate:
        """Score a candidate now; its latency is measured later, interleaved, by :meth:`finish`."""
        value = self.t.score(module) if metric is None else metric
        if self.base is None:
            self.base = value
        if module is not None and cpu_runner is None:
            cpu_runner = C.torch_runner(module, self.batch, "cpu")
        if module is not None and gpu_runner is None and self.gpu and gpu_ok:
            gpu_runner = C.torch_runner(copy.deepcopy(module), self.batch, "cuda")
        self.cpu_runners[name] = cpu_runner
        if gpu_runner is not None:
            self.gpu_runners[name] = gpu_runner
        rel = _rel_drop(value, self.base, self.t.higher_is_better)
        note = "; ".join(x for x in (note, self.t.notes.get(name, "")) if x)
        secondary = self.t.secondary(module) if self.t.secondary is not None and module is not None else {}
        row = Candidate(
            name=name, stage=stage, kind=kind, file=str(file), size_bytes=C.file_size(file),
            params=params or (C.param_count(module) if module is not None else self.rows[0].params),
            cpu=None, gpu=None, metric=value, delta=value - self.base, rel_drop=rel,
            within_tolerance=rel <= self.cfg.tolerance, note=note, secondary=secondary,
        )
        self.rows.append(row)
        log.info("candidate %s: %s=%.4f (rel drop %.2f%%), %d bytes", name, self.t.primary_metric, value, 100 * rel, row.size_bytes)
        return row

    def finish(self) -> list[Candidate]:
        """Measure every candidate's latency in interleaved rounds (fair on a shared machine)."""
        n = C.batch_size_of(self.batch)
        cpu = C.interleaved_latency({k: f for k, f in self.cpu_runners.items() if f}, n, device="cpu")
        gpu = C.interleaved_latency(self.gpu_runners, n, device="cuda") if self.gpu_runners else {}
        self.rows = [r.model_copy(update={"cpu": cpu.get(r.name), "gpu": gpu.get(r.name)}) for r in self.rows]
        return self.rows

    def ok(self, stage: str) -> bool:
        return any(r.within_tolerance for r in self.rows if r.stage == stage)


def _finetune(module: nn.Module, target: CompressTarget, run_key: str, epochs: int) -> nn.Module:
    """Train ``module`` further, in place: on its own loss, or on the adapter's ``loss_fn``."""
    if epochs <= 0:
        return module
    spec = TrainSpec(run_key=run_key, max_epochs=epochs, patience=max(1, epochs), monitor="val/loss", mode="min", fresh=True)
    trainable = module if target.loss_fn is None else C.make_trainable(module, target.loss_fn, lr=target.lr)
    trainable.train()
    train_model_task(trainable, target.datamodule, spec)
    return module.cpu().eval()


def render_candidates(result: CompressResult) -> str:
    """Markdown of the candidates table, the ONNX parity and the sensitivity analysis."""
    def lat(x: C.Latency | None) -> str:
        return "—" if x is None else f"{x.p50_ms:.2f}"

    def thr(x: C.Latency | None) -> str:
        return "—" if x is None else f"{x.throughput:,.0f}"

    base = result.candidates[0]
    batch = base.cpu.batch_size if base.cpu else 0
    others = list(dict.fromkeys(k for r in result.candidates for k in r.secondary))

    def other(r: Candidate) -> str:
        return "".join(f" {r.secondary[k]:.4f} |" if k in r.secondary else " — |" for k in others)

    direction = "higher" if result.higher_is_better else "lower"
    lines = [
        f"# Compression of {result.source}",
        "",
        (
            f"Primary metric `{result.primary_metric}` ({direction} is better) on {result.data_note}; tolerance "
            f"{result.tolerance:.1%} relative. Latency: p50 per batch of {batch}."
        ),
        "",
        (
            "| candidate | stage | kind | size on disk | vs original | params | p50 ms CPU | samples/s CPU "
            f"| p50 ms GPU | samples/s GPU | {result.primary_metric} | delta | within tol. |"
            + "".join(f" {k} (not used to choose) |" for k in others) + " note |"
        ),
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|" + "---:|" * len(others) + "---|",
    ]
    for r in result.candidates:
        chosen = " **(chosen)**" if r.name == result.chosen else ""
        lines.append(
            f"| {r.name}{chosen} | {r.stage} | {r.kind} | {r.size_bytes / 1024:,.1f} KiB | "
            f"{base.size_bytes / r.size_bytes:.2f}x | {r.params:,} | {lat(r.cpu)} | {thr(r.cpu)} | {lat(r.gpu)} | "
            f"{thr(r.gpu)} | {r.metric:.4f} | {r.delta:+.4f} ({_rel_change(r.delta, base.metric):+.2f}%) | "
            f"{'yes' if r.within_tolerance else 'no'} |{other(r)} {r.note} |"
        )
    L8, ox = result.int8_layers, result.onnx
    per_output = ""
    if ox.max_abs_diff_per_output:
        names = result.output_columns or [str(i) for i in range(len(ox.max_abs_diff_per_output))]
        per_output = " (" + ", ".join(f"{n}: {d:.2e}" for n, d in zip(names, ox.max_abs_diff_per_output, strict=False)) + ")"
    lines += [
        "",
        (
            f"INT8 quantized layers ({', '.join(L8.layers)}): {L8.fp32_bytes:,} -> {L8.int8_bytes:,} bytes "
            f"(**{L8.ratio:.2f}x**)."
        ),
        "",
        (
            f"ONNX parity ({ox.n} held-out samples, onnxruntime vs PyTorch): max abs diff "
            f"**{ox.max_abs_diff:.2e}**{per_output} (tolerance {ox.atol:g}); metric {ox.metric_torch:.6f} vs "
            f"{ox.metric_onnx:.6f}: {'passed' if ox.passed else 'FAILED'}."
        ),
        "",
        f"Chosen: {result.chosen or 'none within tolerance'}"
        + (f"; registered as `{result.variant.spec}` (parent `{result.source}`)." if result.variant else "."),
    ]
    if result.sensitivity:
        ratios = sorted({r.ratio for r in result.sensitivity})
        lines += ["", f"## Pruning sensitivity (each layer pruned alone; {result.primary_metric} change towards worse)", "",
                  "| layer | " + " | ".join(f"{x:.0%}" for x in ratios) + " |",
                  "|---|" + "---:|" * len(ratios)]
        for layer in dict.fromkeys(r.layer for r in result.sensitivity):
            cells = {r.ratio: r.drop for r in result.sensitivity if r.layer == layer}
            lines.append(f"| {layer} | " + " | ".join(f"{cells.get(x, float('nan')):+.4f}" for x in ratios) + " |")
    return "\n".join(lines) + "\n"


@task(name="evaluate-int8", cache_policy=NONE)
def _int8_stage(target: CompressTarget, bench: _Bench) -> tuple[dict[str, torch.Tensor], C.LayerSize]:
    """Dynamic INT8 and weight-only INT8 candidates."""
    qmodel = C.quantize_dynamic_int8(target.model)
    state = C.int8_state_dict(qmodel)
    path = bench.out / "int8-dynamic.safetensors"
    C.save_state(state, path)
    bench.add("int8-dynamic", "int8", KIND_INT8, path, qmodel, gpu_ok=False, params=C.param_count(target.model),
              note="CPU kernels; GPU n/a")
    wo_state = C.weight_only_int8_state(target.model)
    wo_path = bench.out / "int8-weight-only.safetensors"
    C.save_state(wo_state, wo_path)
    wo_model = C.load_weight_only_int8(target.model, wo_state)
    bench.add("int8-weight-only", "int8", KIND_INT8_WO, wo_path, wo_model, note="int8 on disk, fp32 compute")
    return state, C.quantized_layer_size(target.model, state)


@task(name="evaluate-pruning", cache_policy=NONE)
def _pruning_stage(target: CompressTarget, bench: _Bench, cfg: CompressConfig, source: str) -> tuple[list[C.SensitivityRow], list[C.PruneReport], dict[str, nn.Module]]:
    """Sensitivity analysis, structured neuron pruning and global magnitude pruning (+ fine-tuning)."""
    sens = C.sensitivity_analysis(
        target.model, target.score, ratios=cfg.sensitivity_ratios,
        higher_is_better=target.higher_is_better, baseline=bench.base,
    )
    reports, modules = [], {}
    key = stable_hash({"src": source, "ratio": cfg.prune_ratio, "epochs": cfg.finetune_epochs})
    if target.prune_plan is not None:
        structured, rep = C.prune_channels(target.model, cfg.prune_ratio, target.prune_plan)
    else:
        structured, rep = C.structured_prune(target.model, cfg.prune_ratio)
    structured = _finetune(structured, target, f"compress-structured-{key}", cfg.finetune_epochs)
    path = bench.out / "pruned-structured.safetensors"
    C.save_state(structured.state_dict(), path)
    bench.add("pruned-structured", "pruning", KIND_FP32, path, structured,
              note=f"{cfg.prune_ratio:.0%} {target.prune_note}, then {cfg.finetune_epochs} fine-tuning epochs "
              "(extra training: compare with care)")
    reports.append(rep)
    modules["pruned-structured"] = structured
    keys = C.prunable_weights(target.model)
    sparse, rep2 = C.global_magnitude_prune(target.model, cfg.prune_ratio, keys, keep_masks=cfg.finetune_epochs > 0)
    sparse = C.finalize_pruning(_finetune(sparse, target, f"compress-global-{key}", cfg.finetune_epochs))
    rep2 = rep2.model_copy(update={"zero_fraction": C.zero_fraction(sparse, keys)})
    path = bench.out / "pruned-global.safetensors"
    C.save_state(sparse.state_dict(), path)
    bench.add("pruned-global", "pruning", KIND_FP32, path, sparse,
              note=f"{rep2.zero_fraction:.0%} zeros; dense storage: no size or speed gain")
    reports.append(rep2)
    modules["pruned-global"] = sparse
    return sens, reports, modules


@task(name="evaluate-distillation", cache_policy=NONE)
def _distill_stage(target: CompressTarget, bench: _Bench, cfg: CompressConfig, source: str) -> tuple[nn.Module, dict[str, Any]] | None:
    """Train a smaller student on the teacher's soft labels plus the hard labels."""
    if target.make_student is None:
        log.info("no student defined for this model type; distillation skipped")
        return None
    student, params = target.make_student()
    losses: dict[str, Any] = {}
    if target.loss_fn is not None:
        losses = {"hard_loss": target.loss_fn, "soft_loss": target.soft_loss, "lr": target.lr}
    distiller = C.make_distiller(student, target.model, temperature=cfg.temperature, alpha=cfg.alpha,
                                 label_key=target.label_key, pos_weight=target.pos_weight, **losses)
    key = stable_hash({"src": source, "T": cfg.temperature, "a": cfg.alpha, "e": cfg.distill_epochs, "hp": params.get("hparams")})
    spec = TrainSpec(run_key=f"compress-distill-{key}", max_epochs=cfg.distill_epochs, patience=3, monitor="val/loss", mode="min", fresh=True)
    train_model_task(distiller, target.datamodule, spec)
    student = distiller.student.cpu().eval()
    path = bench.out / "distilled.safetensors"
    C.save_state(student.state_dict(), path)
    bench.add("distilled", "distillation", KIND_FP32, path, student,
              note=f"student, T={cfg.temperature:g}, alpha={cfg.alpha:g}, {cfg.distill_epochs} epochs")
    return student, params


def load_variant(ref: ModelRef, registry: ModelRegistry | None = None) -> nn.Module:
    """A registered model or compressed variant, rebuilt from safetensors (no pickle)."""
    adapter = adapter_for(ref)
    return C.load_variant(ref, registry or ModelRegistry(), lambda params: adapter.build(params))


# ------------------------------------------------------------------------------------
# the flow


@flow(name="model-compress", log_prints=True)
def model_compress(
    model: str,
    config: CompressConfig | None = None,
    data_options: dict[str, Any] | None = None,
) -> CompressResult:
    """Compress a registered model progressively: INT8 first; if the primary metric drops by
    more than the tolerance, pruning (sensitivity analysis, structured and global, fine-tuned),
    then distillation. Every candidate is scored on the same held-out data as the original;
    the fp32 model is exported to ONNX and checked against PyTorch with onnxruntime. Publishes
    one candidates table and registers the smallest candidate within tolerance as a variant."""
    started = dt.datetime.now()
    config = config or CompressConfig()
    set_cpu_threads(get_train_settings().num_threads)
    registry = ModelRegistry()
    ref = registry.resolve(model)
    adapter = adapter_for(ref)
    target = adapter.prepare(ref, dict(data_options or {}))
    out_dir = home_layout().new_report(f"compress-{ref.name}-v{ref.version}")
    out_dir.mkdir(parents=True, exist_ok=True)
    bench = _Bench(target, config, out_dir)
    # -- original and its ONNX export (same graph, another runtime)
    fp32_path = out_dir / "fp32.safetensors"
    C.save_state(target.model.state_dict(), fp32_path)
    bench.add("fp32", "original", KIND_FP32, fp32_path, target.model)
    onnx_path, names = C.export_onnx_task(target.model, _latency_batch(target, 2), out_dir / "fp32.onnx",
                                          input_names=target.input_names)
    parity = C.check_onnx_parity_task(target.model, onnx_path, target.test_batches, names, atol=config.onnx_atol,
                                      metric=lambda out: target.metric(target.labels, out))
    if target.bench_inputs is not None:  # the latency batch too: more held-out rows than the metric's
        parity = _merge_parity(parity, C.check_onnx_parity(target.model, onnx_path, [bench.batch], names, atol=config.onnx_atol))
    session = C.onnx_session(onnx_path)
    gpu_onnx = None
    if bench.gpu:
        try:
            gpu_onnx = C.onnx_runner(C.onnx_session(onnx_path, device="cuda"), bench.batch, names)
        except RuntimeError as exc:
            log.info("no ONNX GPU latency: %s", exc)
    bench.add("fp32-onnx", "export", "onnx", onnx_path, None, metric=parity.metric_onnx,
              cpu_runner=C.onnx_runner(session, bench.batch, names), gpu_runner=gpu_onnx,
              note=f"onnxruntime; max abs diff {parity.max_abs_diff:.1e}")
    # -- stage 1: INT8
    int8_state, layer_size = _int8_stage(target, bench)
    sens: list[C.SensitivityRow] = []
    prune_reports: list[C.PruneReport] = []
    modules: dict[str, tuple[nn.Module | dict[str, torch.Tensor], dict[str, Any], str]] = {
        "int8-dynamic": (int8_state, ref.params, KIND_INT8),
        "int8-weight-only": (C.weight_only_int8_state(target.model), ref.params, KIND_INT8_WO),
    }
    # -- stage 2: pruning, only if INT8 lost too much
    if config.try_all or not bench.ok("int8"):
        sens, prune_reports, pruned = _pruning_stage(target, bench, config, ref.spec)
        modules.update({k: (m, ref.params, KIND_FP32) for k, m in pruned.items()})
    # -- stage 3: distillation, only if pruning lost too much too
    if config.try_all or not (bench.ok("int8") or bench.ok("pruning")):
        distilled = _distill_stage(target, bench, config, ref.spec)
        if distilled is not None:
            modules["distilled"] = (distilled[0], distilled[1], KIND_FP32)
    bench.finish()
    # -- choose: the smallest file within tolerance, then the fastest
    fits = [r for r in bench.rows if r.stage not in {"original", "export"} and r.within_tolerance]
    chosen = min(fits, key=lambda r: (r.size_bytes, r.cpu.p50_ms if r.cpu else 0.0)) if fits else None
    variant = None
    if chosen is not None and config.register_variant:
        obj, params, kind = modules[chosen.name]
        state = obj if isinstance(obj, dict) else obj.state_dict()
        slug = {"int8-dynamic": "int8", "int8-weight-only": "int8wo"}.get(chosen.name, chosen.name)
        extra: dict[str, Path] = {}
        if kind == KIND_FP32 and isinstance(obj, nn.Module):  # an fp32 graph: ship its ONNX export too
            path, names = C.export_onnx(obj, _latency_batch(target, 2), out_dir / f"{chosen.name}.onnx",
                                        input_names=target.input_names)
            if C.check_onnx_parity(obj, path, target.test_batches, names, atol=config.onnx_atol).passed:
                extra["model.onnx"] = path
        variant = registry.register(
            f"{ref.name}-{slug}", state,
            params={**params, "compression": {"method": chosen.name, "source": ref.spec, "tolerance": config.tolerance}},
            metrics={**chosen.secondary, ref.primary_metric: chosen.metric, f"{ref.primary_metric}_source": bench.base or 0.0,
                     "size_bytes": float(chosen.size_bytes),
                     "latency_p50_ms_cpu": chosen.cpu.p50_ms if chosen.cpu else float("nan")},
            primary_metric=ref.primary_metric, higher_is_better=ref.higher_is_better,
            data_hash=target.data_hash, parent=ref.spec, kind=kind,
            tags={"compression": chosen.name, "source": ref.spec}, extra_files=extra,
        )
    result = CompressResult(
        source=ref.spec, primary_metric=ref.primary_metric, higher_is_better=ref.higher_is_better,
        original_metric=bench.base or 0.0, tolerance=config.tolerance, data_note=target.data_note,
        candidates=bench.rows, int8_layers=layer_size, onnx=parity, output_columns=target.output_columns,
        sensitivity=sens, prune=prune_reports, chosen=chosen.name if chosen else None, variant=variant, report_dir=str(out_dir), seconds=(dt.datetime.now() - started).total_seconds(),
    )
    markdown = render_candidates(result)
    (out_dir / "report.md").write_text(markdown)
    publish_eval_report_task(markdown, key=artifact_key(f"compress-{ref.name}"), description="Compression candidates")
    return result


# ------------------------------------------------------------------------------------
# command line


def _summary(r: CompressResult) -> str:
    lines = [f"model-compress {r.source}: {r.primary_metric} {r.original_metric:.4f}, tolerance {r.tolerance:.1%}"]
    for c in r.candidates:
        cpu = f"{c.cpu.p50_ms:8.2f} ms" if c.cpu else "       —"
        lines.append(
            f"  {c.name:18s} {c.size_bytes / 1024:9.1f} KiB  {cpu}  {c.metric:.4f} ({_rel_change(c.delta, r.original_metric):+.2f}%)"
            + "".join(f"  {k} {v:.4f}" for k, v in c.secondary.items())
            + f"{'' if c.within_tolerance else '  over tolerance'}"
        )
    lines += [
        (
            f"  INT8 layers {r.int8_layers.ratio:.2f}x smaller; ONNX max abs diff {r.onnx.max_abs_diff:.2e} "
            f"({'passed' if r.onnx.passed else 'FAILED'})"
        ),
        f"  chosen: {r.chosen or 'none'}" + (f" -> registered {r.variant.spec}" if r.variant else ""),
        f"  report: {r.report_dir}/report.md  ({r.seconds:.0f} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.compress --model NAME[:VERSION]``."""
    from flows.fraud import _data_args
    from solutions.fraud.config import SyntheticDataConfig
    from solutions.sensor.config import SyntheticFleetConfig

    d = CompressConfig()
    p = argparse.ArgumentParser(prog="python -m flows.compress", description=model_compress.description)
    p.add_argument("--model", required=True, help="NAME[:VERSION|alias] in the registry (default version: champion)")
    p.add_argument("--tolerance", type=float, default=d.tolerance, help="relative metric drop accepted (default %(default)s)")
    p.add_argument("--all", action="store_true", help="run every stage, not only until one fits the tolerance")
    p.add_argument("--prune-ratio", type=float, default=d.prune_ratio, help="default %(default)s")
    p.add_argument("--finetune-epochs", type=int, default=d.finetune_epochs, help="after pruning (default %(default)s)")
    p.add_argument("--distill-epochs", type=int, default=d.distill_epochs, help="default %(default)s")
    p.add_argument("--temperature", type=float, default=d.temperature, help="distillation temperature (default %(default)s)")
    p.add_argument("--latency-batch", type=int, default=d.latency_batch, help="default %(default)s")
    p.add_argument("--no-register", action="store_true", help="do not register the chosen candidate")
    _data_args(p)
    f = SyntheticFleetConfig()
    s = p.add_argument_group(
        "sensor data (sensor models; --data is then a long-format readings file, --columns and --seed apply too)"
    )
    s.add_argument("--events", metavar="FILE", help="failure events CSV/Parquet beside --data")
    s.add_argument("--cmapss-dir", metavar="DIR", help="folder with the NASA C-MAPSS files")
    s.add_argument("--subset", default="FD001", help="C-MAPSS subset (default %(default)s)")
    s.add_argument("--n-assets", type=int, default=f.n_assets, help="synthetic fleet (default %(default)s)")
    s.add_argument("--min-life", type=int, default=f.min_life, help="default %(default)s")
    s.add_argument("--max-life", type=int, default=f.max_life, help="default %(default)s")
    add_common(p)
    args = p.parse_args(argv)
    config = CompressConfig(
        tolerance=args.tolerance, try_all=args.all, prune_ratio=args.prune_ratio, finetune_epochs=args.finetune_epochs,
        distill_epochs=args.distill_epochs, temperature=args.temperature, latency_batch=args.latency_batch,
        register_variant=not args.no_register,
    )
    options = {
        "data": args.data, "columns": parse_columns(args.columns), "accounts": args.accounts,
        "synthetic": SyntheticDataConfig(
            n_accounts=args.n_accounts, n_terminals=args.n_terminals, n_days=args.n_days,
            fraud_rate=args.fraud_rate, seed=args.seed,
        ).model_dump(),
        "events": args.events, "cmapss_dir": args.cmapss_dir, "subset": args.subset,
        "fleet": {"n_assets": args.n_assets, "min_life": args.min_life, "max_life": args.max_life, "seed": args.seed},
    }
    return run_command(lambda: model_compress(model=args.model, config=config, data_options=options),
                       as_json=args.json, summary=_summary)


if __name__ == "__main__":
    sys.exit(main())
