"""What ``model-compress`` produced, and how it reads: the candidates table and the summary."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from infra.registry import ModelRef
from tasks.compress import Candidate, Latency, LayerSize, OnnxParity, PruneReport, SensitivityRow, rel_change


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
    int8_layers: LayerSize
    onnx: OnnxParity
    output_columns: list[str] = Field(default_factory=list, description="Names of the model output's columns.")
    sensitivity: list[SensitivityRow]
    prune: list[PruneReport]
    chosen: str | None
    variant: ModelRef | None
    report_dir: str
    seconds: float


def _p50(x: Latency | None) -> str:
    return "—" if x is None else f"{x.p50_ms:.2f}"


def _throughput(x: Latency | None) -> str:
    return "—" if x is None else f"{x.throughput:,.0f}"


def _sensitivity_table(result: CompressResult) -> list[str]:
    if not result.sensitivity:
        return []
    ratios = sorted({r.ratio for r in result.sensitivity})
    lines = ["", f"## Pruning sensitivity (each layer pruned alone; {result.primary_metric} change towards worse)", "",
             "| layer | " + " | ".join(f"{x:.0%}" for x in ratios) + " |",
             "|---|" + "---:|" * len(ratios)]
    for layer in dict.fromkeys(r.layer for r in result.sensitivity):
        cells = {r.ratio: r.drop for r in result.sensitivity if r.layer == layer}
        lines.append(f"| {layer} | " + " | ".join(f"{cells.get(x, float('nan')):+.4f}" for x in ratios) + " |")
    return lines


def render_candidates(result: CompressResult) -> str:
    """Markdown of the candidates table, the ONNX parity and the sensitivity analysis."""
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
            f"{base.size_bytes / r.size_bytes:.2f}x | {r.params:,} | {_p50(r.cpu)} | {_throughput(r.cpu)} | "
            f"{_p50(r.gpu)} | {_throughput(r.gpu)} | {r.metric:.4f} | "
            f"{r.delta:+.4f} ({rel_change(r.delta, base.metric):+.2f}%) | "
            f"{'yes' if r.within_tolerance else 'no'} |{other(r)} {r.note} |"
        )
    int8, ox = result.int8_layers, result.onnx
    per_output = ""
    if ox.max_abs_diff_per_output:
        names = result.output_columns or [str(i) for i in range(len(ox.max_abs_diff_per_output))]
        per_output = " (" + ", ".join(f"{n}: {d:.2e}" for n, d in zip(names, ox.max_abs_diff_per_output, strict=False)) + ")"
    lines += [
        "",
        (
            f"INT8 quantized layers ({', '.join(int8.layers)}): {int8.fp32_bytes:,} -> {int8.int8_bytes:,} bytes "
            f"(**{int8.ratio:.2f}x**)."
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
    return "\n".join(lines + _sensitivity_table(result)) + "\n"


def summarize(r: CompressResult) -> str:
    """The result for people: one line per candidate, then the INT8, ONNX and choice lines."""
    lines = [f"model-compress {r.source}: {r.primary_metric} {r.original_metric:.4f}, tolerance {r.tolerance:.1%}"]
    for c in r.candidates:
        cpu = f"{c.cpu.p50_ms:8.2f} ms" if c.cpu else "       —"
        lines.append(
            f"  {c.name:18s} {c.size_bytes / 1024:9.1f} KiB  {cpu}  {c.metric:.4f} "
            f"({rel_change(c.delta, r.original_metric):+.2f}%)"
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
