"""ONNX export and ONNX Runtime sessions, for any ``torch.nn.Module``: the compress toolchain's
export step, one layer down so that clients in ``infra`` (the local embedder) use it too.

- :func:`export_onnx`: TorchScript exporter, dynamic batch axis (and any extra dynamic axes).
- :func:`quantize_onnx_int8`: dynamic INT8 quantization of an exported graph's MatMul/Gemm
  weights with ONNX Runtime's quantizer (int8 weights, activations quantized on the fly).
- :func:`onnx_session`: a CPU (or CUDA) inference session with a deliberate thread count.

``tasks/compress.py`` re-exports these under its own names; nothing here is domain code.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import nn

    Inputs = torch.Tensor | tuple[torch.Tensor, ...] | Mapping[str, torch.Tensor]

log = logging.getLogger(__name__)


def _positional(model: nn.Module, names: Sequence[str]) -> nn.Module:
    """``model`` (which reads a dict of tensors) as a module taking them positionally."""
    from torch import nn

    class PositionalInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.names = model, list(names)

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(dict(zip(self.names, tensors, strict=True)))

    return PositionalInputs()


def onnx_feed(inputs: Inputs, input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """The onnxruntime feed for one batch of inputs."""
    if isinstance(inputs, Mapping):
        return {k: inputs[k].cpu().numpy() for k in input_names}
    tensors = inputs if isinstance(inputs, tuple) else (inputs,)
    return {k: t.cpu().numpy() for k, t in zip(input_names, tensors)}


def export_onnx(
    model: nn.Module,
    example_inputs: Inputs,
    path: Path,
    *,
    input_names: Sequence[str] | None = None,
    opset: int = 17,
    extra_dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
) -> tuple[Path, list[str]]:
    """Export an fp32 model to ONNX with a dynamic batch axis on every input and the output.

    A dict-input model is exported through a positional wrapper; ``input_names`` picks
    (and orders) the dict keys it reads. ``extra_dynamic_axes`` adds axes per input or
    ``"output"`` (e.g. ``{"input_ids": {1: "tokens"}}`` for variable-length text). Uses the
    TorchScript exporter (no onnxscript). Returns the path and the ONNX input names.
    """
    import torch

    model = copy.deepcopy(model).cpu().eval()
    if isinstance(example_inputs, Mapping):
        names = list(input_names or example_inputs.keys())
        wrapped: nn.Module = _positional(model, names)
        args = tuple(example_inputs[k].cpu() for k in names)
    else:
        args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        args = tuple(a.cpu() for a in args)
        names = list(input_names or [f"input_{i}" for i in range(len(args))])
        wrapped = model
    dynamic: dict[str, dict[int, str]] = {n: {0: "batch"} for n in names} | {"output": {0: "batch"}}
    for name, axes in (extra_dynamic_axes or {}).items():
        dynamic.setdefault(name, {}).update(axes)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapped, args, str(path), dynamo=False, input_names=names, output_names=["output"],
            dynamic_axes=dynamic, opset_version=opset, do_constant_folding=True,
        )
    log.info("exported ONNX %s (%d bytes)", path, path.stat().st_size)
    return path, names


#: Element-wise ops a decomposed activation is made of (GELU: Div, Erf, Add, Mul, Mul).
_ELEMENTWISE = ("Mul", "Add", "Div", "Sub", "Pow", "Sqrt", "Cast")


def after_activation(path: Path, ops: Sequence[str] = ("Erf", "Gelu", "BiasGelu", "FastGelu", "Tanh"),
                     depth: int = 5) -> list[str]:
    """MatMul/Gemm nodes whose input is an activation in ``ops`` (reached back through element-wise
    ops only): a transformer's feed-forward down-projections, whose inputs quantize worst."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    found = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        frontier = [producer[node.input[0]]] if node.input[0] in producer else []
        for _ in range(depth):
            if any(n.op_type in ops for n in frontier):
                found.append(node.name)
                break
            frontier = [producer[t] for n in frontier if n.op_type in _ELEMENTWISE for t in n.input if t in producer]
            if not frontier:
                break
    return found


def fuse_transformer(src: Path, dst: Path, num_heads: int = 0, hidden_size: int = 0) -> dict[str, int]:
    """ONNX Runtime's transformer fusions (attention, skip-LayerNorm, bias-GELU) of a BERT-like
    encoder graph, written to ``dst``; returns how many of each fused operator it made (none: the
    graph is copied as it was, still correct, only slower)."""
    from onnxruntime.transformers.optimizer import optimize_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = optimize_model(str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                                   opt_level=1)
    dst.parent.mkdir(parents=True, exist_ok=True)
    optimized.save_model_to_file(str(dst))
    stats = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    log.info("fused %s: %s", src.name, stats)
    return stats


def quantize_onnx_int8(src: Path, dst: Path, exclude: Sequence[str] = ()) -> Path:
    """Dynamic INT8 quantization of ``src``'s weights (MatMul/Gemm, fused Attention) into ``dst``, per channel;
    the nodes named in ``exclude`` stay fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul", "Gemm", "Attention"], nodes_to_exclude=list(exclude),
                         extra_options={"DefaultTensorType": 1})  # FLOAT, for graphs with fused (contrib) ops
    log.info("quantized ONNX %s -> %s (%d -> %d bytes, %d nodes kept fp32)", src.name, dst.name,
             src.stat().st_size, dst.stat().st_size, len(exclude))
    return dst


def onnx_session(path: Path, threads: int | None = None, device: str = "cpu") -> Any:
    """An onnxruntime session (CUDA provider when ``device`` is cuda and it is available).

    ``threads``: intra-op threads (default: torch's thread count, so both runtimes use the same).
    """
    import onnxruntime as ort

    if threads is None:
        import torch

        threads = torch.get_num_threads()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    providers = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
        providers = ["CUDAExecutionProvider", *providers]
    return ort.InferenceSession(str(path), sess_options=opts, providers=providers)
