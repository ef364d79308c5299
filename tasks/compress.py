"""Model compression and export, for any ``torch.nn.Module``: INT8, pruning, distillation, ONNX.

Domain-agnostic: the caller builds the model, gives example inputs and an
``evaluate(model) -> float`` function for its primary metric; everything here works on
modules, tensors and files.

- INT8: dynamic quantization of Linear / GRU / LSTM (int8 weights, activations quantized
  on the fly, CPU kernels), and a weight-only INT8 variant (int8 on disk, dequantized at
  load: smaller files, runs on any device). Both are stored as plain tensors
  (:func:`int8_state_dict`), so they load with safetensors or
  ``torch.load(weights_only=True)``; never as pickled packed parameters.
- Pruning: per-layer sensitivity analysis, global magnitude pruning (sparsity, masks),
  structured neuron pruning of MLPs, and structured channel pruning along a caller-given
  plan (Conv1d channels with their BatchNorm, Linear neurons); both really shrink tensors.
- Distillation: a caller-built student trained on the teacher's temperature-softened
  outputs plus the hard labels (:class:`Distiller` + ``train_model``); the caller may
  supply both losses (e.g. for regression or multi-head outputs).
- Fine-tuning of a plain module with a caller-given loss (:func:`make_trainable`).
- ONNX: export with a dynamic batch axis and a parity check with onnxruntime.
- Measurement: size on disk, p50 latency per batch and throughput.

Plain functions only (no Prefect): the compress flow's steps (``flows/compress/steps.py``)
wrap them. :class:`Bench` scores and times candidates against the original of a
:class:`~infra.compression.CompressTarget` (the contract a solution's adapter fills in).
"""

from __future__ import annotations

import copy
import itertools
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from infra.compression import ChannelGroup, CompressTarget
from infra.onnx import export_onnx, onnx_feed, onnx_session, quantize_onnx_int8  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

#: Layer types dynamic INT8 quantization applies to.
DYNAMIC_INT8_TYPES: dict[str, type[nn.Module]] = {"Linear": nn.Linear, "GRU": nn.GRU, "LSTM": nn.LSTM}
#: Layer types whose weights pruning and weight-only INT8 consider.
WEIGHT_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.GRU, nn.LSTM, nn.Conv1d, nn.Conv2d)
#: Layers that may sit between two Linear layers of an MLP without changing its width.
ELEMENTWISE_TYPES: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.Dropout, nn.Identity,
)

_Q = "__q"  # suffix marker of quantized tensors in a plain state dict

Inputs = torch.Tensor | tuple[torch.Tensor, ...] | Mapping[str, torch.Tensor]


# ------------------------------------------------------------------------------------
# typed results


class LayerSize(BaseModel):
    """Bytes of the quantized layers' weights before and after INT8."""

    model_config = ConfigDict(frozen=True)

    layers: list[str]
    fp32_bytes: int
    int8_bytes: int

    @property
    def ratio(self) -> float:
        return self.fp32_bytes / self.int8_bytes if self.int8_bytes else 0.0


class SensitivityRow(BaseModel):
    """The metric after pruning one layer alone at one ratio."""

    model_config = ConfigDict(frozen=True)

    layer: str = Field(description="module.param, e.g. head.0.weight")
    ratio: float
    metric: float
    drop: float = Field(description="Baseline minus metric (positive = worse) for higher-is-better.")


class PruneReport(BaseModel):
    """What a pruning step removed."""

    model_config = ConfigDict(frozen=True)

    method: str
    ratio: float
    params_before: int
    params_after: int
    zero_fraction: float = Field(description="Share of zero weights in the pruned layers.")
    shapes: dict[str, list[int]] = Field(default_factory=dict, description="New weight shapes (structured).")


class OnnxParity(BaseModel):
    """ONNX Runtime vs PyTorch on the same held-out inputs."""

    model_config = ConfigDict(frozen=True)

    path: str
    n: int
    max_abs_diff: float
    atol: float
    metric_torch: float | None = None
    metric_onnx: float | None = None
    metric_tol: float = 1e-4
    passed: bool
    max_abs_diff_per_output: list[float] = Field(
        default_factory=list, description="Per output column, for (batch, k) outputs (e.g. one column per head)."
    )


class Latency(BaseModel):
    """p50 latency of one batch and the throughput it implies."""

    model_config = ConfigDict(frozen=True)

    device: str
    batch_size: int
    p50_ms: float
    p90_ms: float
    throughput: float = Field(description="Samples per second at p50.")
    iters: int


# ------------------------------------------------------------------------------------
# inputs, sizes, latency


def _to_device(inputs: Any, device: str | torch.device) -> Any:
    if isinstance(inputs, torch.Tensor):
        return inputs.to(device)
    if isinstance(inputs, Mapping):
        return {k: _to_device(v, device) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(_to_device(v, device) for v in inputs)
    return inputs


def call_model(model: nn.Module, inputs: Inputs) -> torch.Tensor:
    """``model(inputs)``: a dict or a tensor is passed as one argument, a tuple unpacked."""
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def batch_size_of(inputs: Inputs) -> int:
    first = inputs
    if isinstance(inputs, Mapping):
        first = next(iter(inputs.values()))
    elif isinstance(inputs, (tuple, list)):
        first = inputs[0]
    return int(first.shape[0])


def predict(model: nn.Module, batches: Iterable[Inputs], device: str = "cpu") -> np.ndarray:
    """Concatenated raw outputs of ``model`` over ``batches`` (eval mode, no grad)."""
    model.eval()
    out = []
    with torch.inference_mode():
        for batch in batches:
            y = call_model(model, _to_device(batch, device))
            if not isinstance(y, torch.Tensor):
                raise TypeError(
                    f"{type(model).__name__} returns {type(y).__name__}, not one tensor; wrap it so it does "
                    "(e.g. stack the heads' outputs into columns)"
                )
            out.append(y.float().cpu())
    return torch.cat(out).numpy() if out else np.zeros(0, dtype="float32")


def batch_inputs(batch: Any) -> Any:
    """The model inputs of a training batch: a dict batch whole, else its first element."""
    if isinstance(batch, Mapping):
        return batch
    return batch[0]


def file_size(path: Path) -> int:
    """Bytes on disk."""
    return Path(path).stat().st_size


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save_state(state: Mapping[str, torch.Tensor], path: Path) -> int:
    """Write plain tensors with safetensors; returns the file size in bytes."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path))
    return file_size(path)


def measure_latency(
    fn: Callable[[], Any],
    batch_size: int,
    *,
    device: str = "cpu",
    warmup: int = 3,
    iters: int = 20,
    max_seconds: float = 10.0,
) -> Latency:
    """Time ``fn()`` (one batch) ``iters`` times after ``warmup``; p50/p90 and throughput."""
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    times: list[float] = []
    budget_end = time.perf_counter() + max_seconds
    while len(times) < iters and (len(times) < 3 or time.perf_counter() < budget_end):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    p50 = statistics.median(times)
    p90 = times[min(len(times) - 1, round(0.9 * (len(times) - 1)))]
    return Latency(
        device=device, batch_size=batch_size, p50_ms=p50 * 1e3, p90_ms=p90 * 1e3,
        throughput=batch_size / p50 if p50 > 0 else 0.0, iters=len(times),
    )


def torch_runner(model: nn.Module, inputs: Inputs, device: str = "cpu") -> Callable[[], None]:
    """A no-argument callable running ``model`` on one batch on ``device`` (moves the model)."""
    model = model.to(device).eval()
    batch = _to_device(inputs, device)

    def run() -> None:
        with torch.inference_mode():
            call_model(model, batch)

    return run


def torch_latency(model: nn.Module, inputs: Inputs, device: str = "cpu", **kw: Any) -> Latency:
    """Latency of ``model`` on one batch, on ``device``."""
    return measure_latency(torch_runner(model, inputs, device), batch_size_of(inputs), device=device, **kw)


def interleaved_latency(
    runners: Mapping[str, Callable[[], Any]], batch_size: int, *, device: str = "cpu", rounds: int = 3, iters: int = 7
) -> dict[str, Latency]:
    """Latency of several runners measured in interleaved rounds (median of the rounds' p50s).

    On a shared machine the load drifts; interleaving lets the drift hit every runner alike.
    """
    runs: dict[str, list[Latency]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            runs[name].append(measure_latency(fn, batch_size, device=device, warmup=2, iters=iters))
    out = {}
    for name, lats in runs.items():
        p50 = statistics.median(x.p50_ms for x in lats)
        out[name] = Latency(
            device=device, batch_size=batch_size, p50_ms=p50, p90_ms=statistics.median(x.p90_ms for x in lats),
            throughput=batch_size / (p50 / 1e3) if p50 > 0 else 0.0, iters=sum(x.iters for x in lats),
        )
    return out


# ------------------------------------------------------------------------------------
# INT8: dynamic quantization, weight-only, plain-tensor storage


def quantize_dynamic_int8(model: nn.Module, layers: Sequence[str] = ("Linear", "GRU", "LSTM")) -> nn.Module:
    """A copy of ``model`` with int8 weights on ``layers`` (dynamic activations, CPU)."""
    from torch.ao.quantization import quantize_dynamic

    unknown = set(layers) - set(DYNAMIC_INT8_TYPES)
    if unknown:
        raise ValueError(f"cannot quantize {sorted(unknown)} dynamically; choose from {sorted(DYNAMIC_INT8_TYPES)}")
    float_model = copy.deepcopy(model).cpu().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(float_model, {DYNAMIC_INT8_TYPES[k] for k in layers}, dtype=torch.qint8)


def _pack(prefix: str, q: torch.Tensor, out: dict[str, torch.Tensor]) -> None:
    """A quantized tensor as plain tensors: int8 values, scale(s), zero point(s), axis."""
    out[f"{prefix}.{_Q}.int8"] = q.int_repr()
    if q.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        out[f"{prefix}.{_Q}.scale"] = q.q_per_channel_scales().float()
        out[f"{prefix}.{_Q}.zero_point"] = q.q_per_channel_zero_points().to(torch.int64)
        out[f"{prefix}.{_Q}.axis"] = torch.tensor(q.q_per_channel_axis(), dtype=torch.int64)
    else:
        out[f"{prefix}.{_Q}.scale"] = torch.tensor([q.q_scale()], dtype=torch.float32)
        out[f"{prefix}.{_Q}.zero_point"] = torch.tensor([q.q_zero_point()], dtype=torch.int64)
        out[f"{prefix}.{_Q}.axis"] = torch.tensor(-1, dtype=torch.int64)


def _unpack(prefix: str, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The quantized tensor :func:`_pack` stored under ``prefix``."""
    values = state[f"{prefix}.{_Q}.int8"]
    scale, zp = state[f"{prefix}.{_Q}.scale"], state[f"{prefix}.{_Q}.zero_point"]
    axis = int(state[f"{prefix}.{_Q}.axis"])
    if axis < 0:
        return torch._make_per_tensor_quantized_tensor(values, float(scale[0]), int(zp[0]))
    return torch._make_per_channel_quantized_tensor(values, scale.double(), zp, axis)


def _dynamic_modules(qmodel: nn.Module) -> dict[str, nn.Module]:
    from torch.ao.nn.quantized import dynamic as nnqd

    types = (nnqd.Linear, nnqd.GRU, nnqd.LSTM)
    return {name: m for name, m in qmodel.named_modules() if isinstance(m, types)}


def int8_state_dict(qmodel: nn.Module) -> dict[str, torch.Tensor]:
    """A dynamically quantized model as plain tensors (int8 weights + scales + float rest).

    Loads back with :func:`load_int8_state`; saves with safetensors or ``torch.save`` and
    reads with ``torch.load(weights_only=True)`` (no packed-parameter objects).
    """
    from torch.ao.nn.quantized import dynamic as nnqd

    qmods = _dynamic_modules(qmodel)
    out: dict[str, torch.Tensor] = {}
    for key, value in qmodel.state_dict().items():
        if isinstance(value, torch.Tensor) and not value.is_quantized and not any(
            key.startswith(f"{name}.") for name in qmods
        ):
            out[key] = value.detach().cpu()
    for name, mod in qmods.items():
        if isinstance(mod, nnqd.Linear):
            _pack(f"{name}.weight", mod.weight(), out)
            if mod.bias() is not None:
                out[f"{name}.bias"] = mod.bias().detach().float()
        else:
            for pname, w in mod.get_weight().items():
                _pack(f"{name}.{pname}", w, out)
            for pname, b in mod.get_bias().items():
                if b is not None:
                    out[f"{name}.{pname}"] = b.detach().float()
    return out


def _set_rnn_weights(mod: nn.Module, name: str, state: Mapping[str, torch.Tensor]) -> None:
    """Rebuild a dynamic-quantized GRU/LSTM's packed cells from stored int8 weights."""
    from torch.ao.nn.quantized.dynamic.modules.rnn import PackedParameter

    cells = []
    for layer in range(mod.num_layers):
        for direction in range(2 if mod.bidirectional else 1):
            sfx = f"l{layer}" + ("_reverse" if direction == 1 else "")
            w_ih = _unpack(f"{name}.weight_ih_{sfx}", state)
            w_hh = _unpack(f"{name}.weight_hh_{sfx}", state)
            b_ih = state.get(f"{name}.bias_ih_{sfx}")
            b_hh = state.get(f"{name}.bias_hh_{sfx}")
            packed_ih = torch.ops.quantized.linear_prepack(w_ih, b_ih)
            packed_hh = torch.ops.quantized.linear_prepack(w_hh, b_hh)
            cell = torch.ops.quantized.make_quantized_cell_params_dynamic(
                packed_ih, packed_hh, b_ih, b_hh, True
            )
            cells.append(PackedParameter(cell))
    mod._all_weight_values = nn.ModuleList(cells)


def load_int8_state(
    float_model: nn.Module, state: Mapping[str, torch.Tensor], layers: Sequence[str] = ("Linear", "GRU", "LSTM")
) -> nn.Module:
    """Rebuild a dynamically quantized model from :func:`int8_state_dict` tensors.

    Args:
        float_model: the fp32 architecture (any weights: they are replaced).
        state: the plain tensors (read with safetensors or ``torch.load(weights_only=True)``).
    """
    from torch.ao.nn.quantized import dynamic as nnqd

    float_model = copy.deepcopy(float_model).cpu().eval()
    floats = {k: v for k, v in state.items() if f".{_Q}." not in k}
    shapes = {k: v.shape for k, v in float_model.state_dict().items()}
    loadable = {k: v for k, v in floats.items() if k in shapes and shapes[k] == v.shape}
    float_model.load_state_dict(loadable, strict=False)
    qmodel = quantize_dynamic_int8(float_model, layers)
    qmods = _dynamic_modules(qmodel)
    for name, mod in qmods.items():
        if isinstance(mod, nnqd.Linear):
            mod.set_weight_bias(_unpack(f"{name}.weight", state), state.get(f"{name}.bias"))
        else:
            _set_rnn_weights(mod, name, state)
    missing = [k for k in shapes if not any(k.startswith(f"{n}.") for n in qmods) and k not in floats]
    if missing:
        raise KeyError(f"INT8 state lacks {len(missing)} float tensors, e.g. {missing[:3]}")
    return qmodel


def quantized_layer_size(float_model: nn.Module, int8_state: Mapping[str, torch.Tensor]) -> LayerSize:
    """fp32 bytes vs int8 bytes (values + scales + zero points + float biases) of the quantized layers."""
    names = sorted({k.split(f".{_Q}.")[0].rsplit(".", 1)[0] for k in int8_state if f".{_Q}." in k})
    float_state = float_model.state_dict()
    fp32 = sum(
        v.numel() * 4 for k, v in float_state.items() if any(k.startswith(f"{n}.") for n in names)
    )
    int8 = sum(
        v.numel() * v.element_size() for k, v in int8_state.items()
        if any(k.startswith(f"{n}.") for n in names) and not k.endswith(f"{_Q}.axis")
    )
    return LayerSize(layers=names, fp32_bytes=int(fp32), int8_bytes=int(int8))


def weight_only_int8_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Weights of Linear/GRU/LSTM/Conv layers as per-channel int8 (+ scales); the rest as is.

    On disk ~4x smaller on those layers; :func:`load_weight_only_int8` dequantizes into an
    fp32 model, which then runs on any device (and exports to ONNX).
    """
    out: dict[str, torch.Tensor] = {}
    weight_keys = {
        f"{mname}.{pname}" if mname else pname
        for mname, m in model.named_modules() if isinstance(m, WEIGHT_LAYER_TYPES)
        for pname, p in m.named_parameters(recurse=False) if p.dim() >= 2
    }
    for key, value in model.state_dict().items():
        if key in weight_keys:
            w = value.detach().cpu().float()
            scale = w.abs().amax(dim=tuple(range(1, w.dim()))).clamp(min=1e-12) / 127.0
            q = torch.quantize_per_channel(w, scale.double(), torch.zeros_like(scale, dtype=torch.int64), 0, torch.qint8)
            _pack(key, q, out)
        else:
            out[key] = value.detach().cpu()
    return out


def dequantize_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Plain fp32 tensors from a state holding packed int8 entries."""
    out = {k: v for k, v in state.items() if f".{_Q}." not in k}
    for prefix in {k.split(f".{_Q}.")[0] for k in state if f".{_Q}." in k}:
        out[prefix] = _unpack(prefix, state).dequantize()
    return out


def load_weight_only_int8(model: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """An fp32 copy of ``model`` holding the dequantized weight-only INT8 weights."""
    model = copy.deepcopy(model)
    model.load_state_dict(dequantize_state(state))
    return model.eval()


# ------------------------------------------------------------------------------------
# pruning


def prunable_weights(model: nn.Module, types: tuple[type[nn.Module], ...] = WEIGHT_LAYER_TYPES) -> list[str]:
    """``module.param`` names of the matrix/kernel weights of ``types`` layers."""
    return [
        f"{mname}.{pname}"
        for mname, m in model.named_modules() if isinstance(m, types)
        for pname, p in m.named_parameters(recurse=False) if p.dim() >= 2
    ]


def _param_ref(model: nn.Module, key: str) -> tuple[nn.Module, str]:
    mname, _, pname = key.rpartition(".")
    return model.get_submodule(mname), pname


def magnitude_prune_(model: nn.Module, keys: Sequence[str], ratio: float, *, global_: bool = True, keep_masks: bool = False) -> nn.Module:
    """Zero the smallest-|w| share ``ratio`` of the ``keys`` weights, in place.

    ``global_`` ranks all weights together (layers lose different shares); otherwise each
    layer loses ``ratio``. With ``keep_masks`` the pruning masks stay (for fine-tuning
    without regrowth); call :func:`finalize_pruning` afterwards.
    """
    from torch.nn.utils import prune

    targets = [_param_ref(model, k) for k in keys]
    if global_:
        prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=ratio)
    else:
        for module, pname in targets:
            prune.l1_unstructured(module, pname, amount=ratio)
    if not keep_masks:
        finalize_pruning(model)
    return model


def finalize_pruning(model: nn.Module) -> nn.Module:
    """Make pruning permanent: drop masks and re-parametrisations, keep the zeros."""
    from torch.nn.utils import prune

    for module in model.modules():
        for pname in [h._tensor_name for h in module._forward_pre_hooks.values() if isinstance(h, prune.BasePruningMethod)]:
            prune.remove(module, pname)
    return model


def zero_fraction(model: nn.Module, keys: Sequence[str]) -> float:
    """Share of exactly-zero entries among the ``keys`` weights."""
    tensors = [getattr(*_param_ref(model, k)) for k in keys]
    total = sum(t.numel() for t in tensors)
    return float(sum((t == 0).sum().item() for t in tensors) / total) if total else 0.0


def sensitivity_analysis(
    model: nn.Module,
    evaluate: Callable[[nn.Module], float],
    *,
    ratios: Sequence[float] = (0.25, 0.5, 0.75),
    keys: Sequence[str] | None = None,
    higher_is_better: bool = True,
    baseline: float | None = None,
) -> list[SensitivityRow]:
    """Prune each layer alone at each ratio (L1 magnitude) and measure the metric drop."""
    keys = list(keys) if keys is not None else prunable_weights(model)
    base = evaluate(model) if baseline is None else baseline
    sign = 1.0 if higher_is_better else -1.0
    rows = []
    for key in keys:
        for ratio in ratios:
            pruned = magnitude_prune_(copy.deepcopy(model), [key], ratio, global_=False)
            value = float(evaluate(pruned))
            rows.append(SensitivityRow(layer=key, ratio=ratio, metric=value, drop=sign * (base - value)))
    log.info("sensitivity: %d layers x %d ratios", len(keys), len(ratios))
    return rows


def tolerant_ratios(rows: Sequence[SensitivityRow], max_drop: float) -> dict[str, float]:
    """Per layer, the highest ratio whose drop stays within ``max_drop`` (0 if none)."""
    best: dict[str, float] = {}
    for row in rows:
        best.setdefault(row.layer, 0.0)
        if row.drop <= max_drop and row.ratio > best[row.layer]:
            best[row.layer] = row.ratio
    return best


def global_magnitude_prune(model: nn.Module, ratio: float, keys: Sequence[str] | None = None, keep_masks: bool = False) -> tuple[nn.Module, PruneReport]:
    """A copy of ``model`` with the smallest ``ratio`` of its layer weights zeroed (globally)."""
    pruned = copy.deepcopy(model)
    keys = list(keys) if keys is not None else prunable_weights(pruned)
    before = param_count(pruned)
    magnitude_prune_(pruned, keys, ratio, global_=True, keep_masks=keep_masks)
    frac = zero_fraction(pruned, keys) if not keep_masks else ratio
    return pruned, PruneReport(
        method="global-magnitude", ratio=ratio, params_before=before, params_after=before, zero_fraction=frac
    )


def mlp_blocks(model: nn.Module) -> list[str]:
    """Names of ``nn.Sequential`` blocks whose Linear layers are joined only by elementwise layers."""
    names = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Sequential):
            continue
        kids = list(m.children())
        linears = [k for k in kids if isinstance(k, nn.Linear)]
        if len(linears) >= 2 and all(isinstance(k, (nn.Linear, *ELEMENTWISE_TYPES)) for k in kids):
            names.append(name)
    return names


def prune_mlp_neurons_(model: nn.Module, block: str, ratio: float, *, min_keep: int = 1) -> dict[str, list[int]]:
    """Remove the ``ratio`` lowest-L2 hidden neurons of every inner Linear of ``block``, in place.

    Each inner Linear loses output rows (weight and bias); the next Linear loses the
    matching input columns, so the tensors really shrink. The block's input and output
    widths stay, so the rest of the model is untouched. Returns the new weight shapes.
    """
    seq = model.get_submodule(block)
    kids = list(seq.children())
    if not all(isinstance(k, (nn.Linear, *ELEMENTWISE_TYPES)) for k in kids):
        raise ValueError(
            f"{block!r} holds layers other than Linear and elementwise ones "
            f"({[type(k).__name__ for k in kids]}); structured pruning would change their widths"
        )
    linear_idx = [i for i, k in enumerate(kids) if isinstance(k, nn.Linear)]
    shapes: dict[str, list[int]] = {}
    for cur, nxt in itertools.pairwise(linear_idx):
        layer, after = seq[cur], seq[nxt]
        n_out = layer.out_features
        keep_n = max(min_keep, round(n_out * (1.0 - ratio)))
        importance = layer.weight.detach().norm(dim=1)
        keep = torch.sort(torch.topk(importance, keep_n).indices).values
        new = nn.Linear(layer.in_features, keep_n, bias=layer.bias is not None)
        new_after = nn.Linear(keep_n, after.out_features, bias=after.bias is not None)
        with torch.no_grad():
            new.weight.copy_(layer.weight[keep])
            if layer.bias is not None:
                new.bias.copy_(layer.bias[keep])
            new_after.weight.copy_(after.weight[:, keep])
            if after.bias is not None:
                new_after.bias.copy_(after.bias)
        seq[cur], seq[nxt] = new.to(layer.weight.device), new_after.to(after.weight.device)
    for i in linear_idx:
        shapes[f"{block}.{i}.weight" if block else f"{i}.weight"] = list(seq[i].weight.shape)
    return shapes


def structured_prune(model: nn.Module, ratio: float, blocks: Sequence[str] | None = None) -> tuple[nn.Module, PruneReport]:
    """A copy of ``model`` with ``ratio`` of the hidden neurons of its MLP blocks removed."""
    pruned = copy.deepcopy(model)
    blocks = list(blocks) if blocks is not None else mlp_blocks(pruned)
    if not blocks:
        raise ValueError("no MLP block (nn.Sequential of Linear + elementwise layers) to prune")
    before = param_count(pruned)
    shapes: dict[str, list[int]] = {}
    for block in blocks:
        shapes.update(prune_mlp_neurons_(pruned, block, ratio))
    return pruned, PruneReport(
        method="structured-neurons", ratio=ratio, params_before=before, params_after=param_count(pruned),
        zero_fraction=0.0, shapes=shapes,
    )


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Replace submodule ``name``; the new one keeps the old one's train / eval mode."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    module.train(getattr(parent, child).training)
    setattr(parent, child, module)


def _conv1d_like(conv: nn.Conv1d, in_channels: int, out_channels: int) -> nn.Conv1d:
    if conv.groups != 1:
        raise ValueError(f"cannot resize a grouped Conv1d (groups={conv.groups})")
    return nn.Conv1d(
        in_channels, out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
        dilation=conv.dilation, bias=conv.bias is not None, padding_mode=conv.padding_mode,
    )


def _batchnorm_like(bn: nn.BatchNorm1d, n: int) -> nn.BatchNorm1d:
    return nn.BatchNorm1d(n, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                          track_running_stats=bn.track_running_stats)


def resize_to_state(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    types: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.BatchNorm1d),
) -> nn.Module:
    """Replace Linear / Conv1d / BatchNorm1d layers whose stored tensors have another shape.

    A structurally pruned state then loads into a fresh full-size model of the same
    architecture (:func:`structured_prune`, :func:`prune_channels`). In place; returns ``model``.
    """
    for name, m in list(model.named_modules()):
        if not isinstance(m, types):
            continue
        attr = "weight" if getattr(m, "weight", None) is not None else "running_mean"
        key = f"{name}.{attr}"
        if key not in state or tuple(state[key].shape) == tuple(getattr(m, attr).shape):
            continue
        shape = tuple(state[key].shape)
        if isinstance(m, nn.Linear):
            _set_module(model, name, nn.Linear(shape[1], shape[0], bias=f"{name}.bias" in state))
        elif isinstance(m, nn.Conv1d):
            _set_module(model, name, _conv1d_like(m, shape[1], shape[0]))
        else:
            _set_module(model, name, _batchnorm_like(m, shape[0]))
    return model


def _channel_importance(producer: nn.Module, norm: nn.Module | None) -> torch.Tensor:
    """|BatchNorm scale| when a norm follows (network slimming), else the L2 norm of each output's weights."""
    if norm is not None and getattr(norm, "weight", None) is not None:
        return norm.weight.detach().abs()
    w = producer.weight.detach()
    return w.reshape(w.shape[0], -1).norm(dim=1)


def prune_channels_(model: nn.Module, group: ChannelGroup, ratio: float, *, min_keep: int = 1) -> dict[str, list[int]]:
    """Remove the ``ratio`` least important output channels of ``group.producer``, in place.

    The producer, its norm and its consumers are replaced by smaller layers holding the
    kept slices, so the tensors really shrink. Returns the new weight shapes.
    """
    producer = model.get_submodule(group.producer)
    if not isinstance(producer, (nn.Linear, nn.Conv1d)):
        raise TypeError(f"{group.producer!r} is a {type(producer).__name__}; only Linear and Conv1d outputs can be pruned")
    norm = model.get_submodule(group.norm) if group.norm else None
    if norm is not None and not isinstance(norm, nn.BatchNorm1d):
        raise TypeError(f"{group.norm!r} is a {type(norm).__name__}, not a BatchNorm1d")
    consumers = {name: model.get_submodule(name) for name in group.consumers}
    n_out = producer.weight.shape[0]
    for name, c in consumers.items():
        n_in = c.weight.shape[1] if isinstance(c, (nn.Linear, nn.Conv1d)) else None
        if n_in != n_out * group.repeats + group.passthrough:
            raise ValueError(
                f"consumer {name!r} ({type(c).__name__}, {n_in} inputs) does not read {group.repeats} x {n_out} "
                f"outputs of {group.producer!r} and {group.passthrough} other inputs; fix the ChannelGroup"
            )
    keep_n = max(min_keep, round(n_out * (1.0 - ratio)))
    keep = torch.sort(torch.topk(_channel_importance(producer, norm), keep_n).indices).values
    cols = torch.cat([keep + r * n_out for r in range(group.repeats)]
                     + [torch.arange(n_out * group.repeats, n_out * group.repeats + group.passthrough)])
    shapes: dict[str, list[int]] = {}
    with torch.no_grad():
        if isinstance(producer, nn.Linear):
            new: nn.Module = nn.Linear(producer.in_features, keep_n, bias=producer.bias is not None)
        else:
            new = _conv1d_like(producer, producer.in_channels, keep_n)
        new.weight.copy_(producer.weight[keep])
        if producer.bias is not None:
            new.bias.copy_(producer.bias[keep])
        _set_module(model, group.producer, new.to(producer.weight.device))
        shapes[f"{group.producer}.weight"] = list(new.weight.shape)
        if norm is not None:
            bn = _batchnorm_like(norm, keep_n)
            for attr in ("weight", "bias", "running_mean", "running_var"):
                src, dst = getattr(norm, attr), getattr(bn, attr)
                if src is not None and dst is not None:
                    dst.copy_(src[keep])
            if norm.num_batches_tracked is not None:
                bn.num_batches_tracked.copy_(norm.num_batches_tracked)
            _set_module(model, group.norm, bn.to(producer.weight.device))
        for name, c in consumers.items():
            if isinstance(c, nn.Linear):
                new_c: nn.Module = nn.Linear(len(cols), c.out_features, bias=c.bias is not None)
            else:
                new_c = _conv1d_like(c, len(cols), c.out_channels)
            new_c.weight.copy_(c.weight[:, cols])
            if c.bias is not None:
                new_c.bias.copy_(c.bias)
            _set_module(model, name, new_c.to(c.weight.device))
            shapes[f"{name}.weight"] = list(new_c.weight.shape)
    return shapes


def prune_channels(model: nn.Module, ratio: float, plan: Sequence[ChannelGroup]) -> tuple[nn.Module, PruneReport]:
    """A copy of ``model`` with ``ratio`` of the output channels of every ``plan`` step removed (in order)."""
    if not plan:
        raise ValueError("an empty pruning plan: give at least one ChannelGroup")
    pruned = copy.deepcopy(model)
    before = param_count(pruned)
    shapes: dict[str, list[int]] = {}
    for group in plan:
        shapes.update(prune_channels_(pruned, group, ratio))
    return pruned, PruneReport(
        method="structured-channels", ratio=ratio, params_before=before, params_after=param_count(pruned),
        zero_fraction=0.0, shapes=shapes,
    )


# ------------------------------------------------------------------------------------
# distillation


def _distiller_class():
    import lightning as L
    import torch.nn.functional as F

    class Distiller(L.LightningModule):
        """Trains ``student`` on ``alpha`` x soft (teacher, temperature T) + (1 - alpha) x hard loss.

        Binary outputs (one logit per sample) use BCE against the teacher's
        ``sigmoid(logit / T)``; multi-class outputs use KL divergence of the softmaxes.
        Both soft terms are scaled by T² (Hinton et al. 2015). Batches are dicts (labels
        under ``label_key``, the model gets the whole dict) or ``(inputs, labels, ...)`` tuples.
        Other outputs (regression, several heads) need the caller's losses:
        ``hard_loss(student_out, batch)`` and ``soft_loss(student_out, teacher_out, T)``.
        """

        def __init__(
            self, student: nn.Module, teacher: nn.Module, temperature: float = 4.0, alpha: float = 0.5,
            lr: float = 2e-3, label_key: str = "y", pos_weight: float = 1.0,
            hard_loss: Callable[[torch.Tensor, Any], torch.Tensor] | None = None,
            soft_loss: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None,
        ) -> None:
            super().__init__()
            if temperature <= 0 or not 0.0 <= alpha <= 1.0:
                raise ValueError(f"need temperature > 0 and 0 <= alpha <= 1, got {temperature}, {alpha}")
            self.student, self.teacher = student, teacher
            for p in self.teacher.parameters():
                p.requires_grad_(False)
            self.temperature, self.alpha, self.lr = temperature, alpha, lr
            self.label_key, self.pos_weight = label_key, pos_weight
            if (hard_loss is None) != (soft_loss is None):
                raise ValueError("give both hard_loss and soft_loss, or neither (binary / multi-class defaults)")
            self.hard_loss, self.soft_loss = hard_loss, soft_loss

        def _split(self, batch: Any) -> tuple[Any, torch.Tensor]:
            if isinstance(batch, Mapping):
                return batch, batch[self.label_key]
            return batch[0], batch[1]

        def loss(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            inputs, y = self._split(batch)
            s = call_model(self.student, inputs).float()
            with torch.no_grad():
                t = call_model(self.teacher, inputs).float()
            T = self.temperature
            if self.hard_loss is not None and self.soft_loss is not None:
                soft, hard = self.soft_loss(s, t, T), self.hard_loss(s, batch)
            elif s.dim() == 1 or s.shape[-1] == 1:
                s, t = s.reshape(-1), t.reshape(-1)
                soft = F.binary_cross_entropy_with_logits(s / T, torch.sigmoid(t / T)) * T * T
                weight = torch.as_tensor(self.pos_weight, device=s.device)
                hard = F.binary_cross_entropy_with_logits(s, y.float().reshape(-1), pos_weight=weight)
            else:
                soft = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean") * T * T
                hard = F.cross_entropy(s, y.long())
            return self.alpha * soft + (1 - self.alpha) * hard, soft, hard

        def on_train_epoch_start(self) -> None:
            super().on_train_epoch_start()
            self.teacher.eval()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            total, soft, hard = self.loss(batch)
            n = batch_size_of(self._split(batch)[0]) if not isinstance(batch, Mapping) else len(self._split(batch)[1])
            self.log_dict({"train/loss": total, "train/soft": soft, "train/hard": hard},
                          on_step=False, on_epoch=True, batch_size=n)
            return total

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            total, _, hard = self.loss(batch)
            n = len(self._split(batch)[1])
            self.log_dict({"val/loss": total, "val/hard": hard}, prog_bar=True, batch_size=n)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.student.parameters(), lr=self.lr)

    return Distiller


def make_distiller(student: nn.Module, teacher: nn.Module, **kwargs: Any) -> Any:
    """A LightningModule that distils ``teacher`` into ``student``; fit it with ``train_model``
    (monitor ``val/loss``, mode ``min``); ``.student`` then holds the best weights."""
    return _distiller_class()(student, copy.deepcopy(teacher).eval(), **kwargs)


def _loss_module_class():
    import lightning as L

    class LossModule(L.LightningModule):
        """Trains a plain ``module`` on ``loss_fn(module(inputs), batch)``; logs ``{stage}/loss``."""

        def __init__(self, module: nn.Module, loss_fn: Callable[[torch.Tensor, Any], torch.Tensor], lr: float) -> None:
            super().__init__()
            self.module, self.loss_fn, self.lr = module, loss_fn, lr

        def _step(self, batch: Any, stage: str) -> torch.Tensor:
            inputs = batch_inputs(batch)
            loss = self.loss_fn(call_model(self.module, inputs), batch)
            self.log(f"{stage}/loss", loss, prog_bar=stage != "train", on_epoch=True, on_step=False,
                     batch_size=batch_size_of(inputs))
            return loss

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self._step(batch, "train")

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self._step(batch, "val")

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW([p for p in self.module.parameters() if p.requires_grad], lr=self.lr, weight_decay=1e-4)

    return LossModule


def make_trainable(module: nn.Module, loss_fn: Callable[[torch.Tensor, Any], torch.Tensor], lr: float = 1e-3) -> Any:
    """A LightningModule that fine-tunes the plain ``module`` in place on ``loss_fn(outputs, batch)``.

    Fit it with ``train_model`` (monitor ``val/loss``, mode ``min``); ``module`` then holds
    the best weights. Training batches are dicts (the module gets the whole dict) or tuples
    whose first element is the input.
    """
    return _loss_module_class()(module, loss_fn, lr)


# ------------------------------------------------------------------------------------
# ONNX


# export_onnx, onnx_feed and onnx_session live in infra.onnx (the local embedder uses them too).


def onnx_predict(session: Any, batches: Iterable[Inputs], input_names: Sequence[str]) -> np.ndarray:
    """Concatenated ONNX outputs over ``batches``."""
    out = [session.run(None, onnx_feed(b, input_names))[0] for b in batches]
    return np.concatenate(out) if out else np.zeros(0, dtype="float32")


def check_onnx_parity(
    model: nn.Module,
    path: Path,
    batches: Sequence[Inputs],
    input_names: Sequence[str],
    *,
    atol: float = 1e-4,
    metric: Callable[[np.ndarray], float] | None = None,
    metric_tol: float = 1e-4,
) -> OnnxParity:
    """Run PyTorch and onnxruntime on the same held-out batches; compare outputs and metric."""
    ref = predict(copy.deepcopy(model).cpu(), batches)
    got = onnx_predict(onnx_session(path), batches, input_names)
    if ref.shape != got.shape:
        raise ValueError(f"ONNX output shape {got.shape} differs from PyTorch's {ref.shape}")
    diff = float(np.max(np.abs(ref - got))) if len(ref) else 0.0
    per_output = np.abs(ref - got).reshape(len(ref), -1).max(axis=0).tolist() if len(ref) and ref.ndim > 1 else []
    m_t = m_o = None
    ok = diff <= atol
    if metric is not None:
        m_t, m_o = float(metric(ref)), float(metric(got))
        ok = ok and abs(m_t - m_o) <= metric_tol
    return OnnxParity(
        path=str(path), n=len(ref), max_abs_diff=diff, atol=atol, metric_torch=m_t, metric_onnx=m_o,
        metric_tol=metric_tol, passed=ok, max_abs_diff_per_output=[float(x) for x in per_output],
    )


def onnx_runner(session: Any, inputs: Inputs, input_names: Sequence[str]) -> Callable[[], Any]:
    """A no-argument callable running an onnxruntime session on one batch."""
    feed = onnx_feed(inputs, input_names)
    return lambda: session.run(None, feed)


def onnx_latency(session: Any, inputs: Inputs, input_names: Sequence[str], device: str = "cpu", **kw: Any) -> Latency:
    """Latency of an onnxruntime session on one batch."""
    return measure_latency(onnx_runner(session, inputs, input_names), batch_size_of(inputs), device=device, **kw)


#: Registry ``kind`` of the compressed variants (``torch`` = plain fp32 weights).
KIND_FP32 = "torch"
KIND_INT8 = "torch-int8-dynamic"
KIND_INT8_WO = "torch-int8-weight-only"


def load_variant(ref: Any, registry: Any, build: Callable[[Mapping[str, Any]], nn.Module]) -> nn.Module:
    """A registered model or compressed variant (INT8, pruned, distilled), rebuilt from
    safetensors without pickle.

    Args:
        ref: the registry's ``ModelRef`` of the version.
        registry: the ``ModelRegistry`` holding it.
        build: the solution's constructor of a fresh fp32 module from the version's params;
            structurally pruned layers are resized to the stored tensors here.
    """
    state = registry.load_state_dict(ref)
    plain = dequantize_state(state) if ref.kind in (KIND_INT8, KIND_INT8_WO) else state
    module = resize_to_state(build(ref.params), plain)
    if ref.kind == KIND_INT8:
        return load_int8_state(module.eval(), state)
    module.load_state_dict(dict(plain))
    return module.eval()


# ------------------------------------------------------------------------------------
# candidates: scored and timed against the original on the same held-out data


class Candidate(BaseModel):
    """One row of the candidates table."""

    model_config = ConfigDict(frozen=True)

    name: str
    stage: str = Field(description="original, export, int8, pruning or distillation.")
    kind: str
    file: str
    size_bytes: int
    params: int
    cpu: Latency | None
    gpu: Latency | None = None
    metric: float
    delta: float = Field(description="Metric minus the original's.")
    rel_drop: float = Field(description="Relative drop (positive = worse, whichever way the metric points).")
    within_tolerance: bool
    note: str = ""
    secondary: dict[str, float] = Field(default_factory=dict, description="Other metrics (not used to choose).")


def score(target: CompressTarget, module: nn.Module) -> float:
    """The primary metric of ``module`` on the target's held-out batches."""
    return float(target.metric(target.labels, predict(module, target.test_batches)))


def example_inputs(target: CompressTarget, n: int) -> Any:
    """The first ``n`` held-out inputs (the latency batch; the inputs the model reads only)."""
    first = target.test_batches[0] if target.bench_inputs is None else target.bench_inputs
    if isinstance(first, Mapping):
        return {k: v[:n] for k, v in first.items() if k in target.input_names}
    return first[:n]


def rel_drop(value: float, base: float, higher_is_better: bool) -> float:
    """Relative drop of ``value`` from ``base`` (positive = worse, whichever way the metric points)."""
    sign = 1.0 if higher_is_better else -1.0
    return sign * (base - value) / abs(base) if base else 0.0


def rel_change(delta: float, base: float) -> float:
    """The metric's relative change in percent (its sign is the metric's, not better / worse)."""
    return 100 * delta / abs(base) if base else 0.0


def merge_parity(a: OnnxParity, b: OnnxParity) -> OnnxParity:
    """One parity record over two checks of the same ONNX file (the metric is ``a``'s)."""
    per = [max(x, y) for x, y in zip(a.max_abs_diff_per_output, b.max_abs_diff_per_output, strict=True)]
    return a.model_copy(update={
        "n": a.n + b.n, "max_abs_diff": max(a.max_abs_diff, b.max_abs_diff), "passed": a.passed and b.passed,
        "max_abs_diff_per_output": per,
    })


def choose_candidate(rows: Sequence[Candidate]) -> Candidate | None:
    """The smallest file within tolerance (then the fastest), among the compressed candidates."""
    fits = [r for r in rows if r.stage not in {"original", "export"} and r.within_tolerance]
    return min(fits, key=lambda r: (r.size_bytes, r.cpu.p50_ms if r.cpu else 0.0)) if fits else None


class Bench:
    """Scores candidates against the original on the same held-out data; times them together.

    The first candidate added is the original: its metric is the baseline of every
    relative drop. Latencies are measured by :meth:`finish`, interleaved (fair on a
    shared machine).
    """

    def __init__(self, target: CompressTarget, out_dir: Path, *, tolerance: float, latency_batch: int) -> None:
        self.target, self.out, self.tolerance = target, out_dir, tolerance
        self.batch = example_inputs(target, latency_batch)
        self.gpu = torch.cuda.is_available()
        self.base: float | None = None
        self.rows: list[Candidate] = []
        self.cpu_runners: dict[str, Callable[[], Any]] = {}
        self.gpu_runners: dict[str, Callable[[], Any]] = {}

    def add(self, name: str, stage: str, kind: str, file: Path, module: nn.Module | None, *,
            metric: float | None = None, cpu_runner: Callable[[], Any] | None = None,
            gpu_runner: Callable[[], Any] | None = None, gpu_ok: bool = True, params: int | None = None,
            note: str = "") -> Candidate:
        """Score a candidate now (``metric`` when given, else the module's); time it in :meth:`finish`."""
        t = self.target
        value = score(t, module) if metric is None else metric
        if self.base is None:
            self.base = value
        if module is not None and cpu_runner is None:
            cpu_runner = torch_runner(module, self.batch, "cpu")
        if module is not None and gpu_runner is None and self.gpu and gpu_ok:
            gpu_runner = torch_runner(copy.deepcopy(module), self.batch, "cuda")
        if cpu_runner is not None:
            self.cpu_runners[name] = cpu_runner
        if gpu_runner is not None:
            self.gpu_runners[name] = gpu_runner
        rel = rel_drop(value, self.base, t.higher_is_better)
        note = "; ".join(x for x in (note, t.notes.get(name, "")) if x)
        secondary = t.secondary(module) if t.secondary is not None and module is not None else {}
        row = Candidate(
            name=name, stage=stage, kind=kind, file=str(file), size_bytes=file_size(file),
            params=params or (param_count(module) if module is not None else self.rows[0].params),
            cpu=None, gpu=None, metric=value, delta=value - self.base, rel_drop=rel,
            within_tolerance=rel <= self.tolerance, note=note, secondary=secondary,
        )
        self.rows.append(row)
        log.info("candidate %s: %s=%.4f (rel drop %.2f%%), %d bytes", name, t.primary_metric, value, 100 * rel,
                 row.size_bytes)
        return row

    def finish(self) -> list[Candidate]:
        """Measure every candidate's latency in interleaved rounds; the rows with their latencies."""
        n = batch_size_of(self.batch)
        cpu = interleaved_latency(self.cpu_runners, n, device="cpu")
        gpu = interleaved_latency(self.gpu_runners, n, device="cuda") if self.gpu_runners else {}
        self.rows = [r.model_copy(update={"cpu": cpu.get(r.name), "gpu": gpu.get(r.name)}) for r in self.rows]
        return self.rows

    def ok(self, stage: str) -> bool:
        """Whether a candidate of ``stage`` is within tolerance."""
        return any(r.within_tolerance for r in self.rows if r.stage == stage)
