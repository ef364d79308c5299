"""ONNX export with a dynamic batch axis, parity with PyTorch, distillation loss, latency."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime", reason="ONNX checks need onnxruntime (pip install onnx onnxruntime)")

import tasks.compress as C
from tests.unit.test_compress_quant import TinySeq, seq_batch


def test_onnx_export_dict_inputs_parity_on_other_batch_sizes(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    torch.manual_seed(0)
    model = TinySeq().eval()
    path, names = C.export_onnx(model, seq_batch(2), tmp_path / "m.onnx", input_names=["x", "c"])
    onnx.checker.check_model(str(path))
    held_out = [seq_batch(1, seed=3), seq_batch(77, seed=4), seq_batch(300, seed=5)]  # batch axis is dynamic
    parity = C.check_onnx_parity(model, path, held_out, names, atol=1e-5, metric=lambda out: float((out > 0).mean()))
    assert parity.n == 378 and parity.passed
    assert parity.max_abs_diff < 1e-5
    assert parity.metric_torch == parity.metric_onnx
    lat = C.onnx_latency(C.onnx_session(path), held_out[1], names, iters=3)
    assert lat.batch_size == 77 and lat.p50_ms > 0 and lat.throughput > 0


def test_onnx_export_positional_tensor_model(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    path, names = C.export_onnx(model, torch.randn(3, 6), tmp_path / "mlp.onnx")
    x = torch.randn(50, 6)
    got = C.onnx_predict(C.onnx_session(path), [x], names)
    np.testing.assert_allclose(got, model(x).detach().numpy(), atol=1e-5)


def test_distiller_moves_student_towards_teacher() -> None:
    torch.manual_seed(0)
    teacher, student = TinySeq().eval(), TinySeq(hidden=8, mlp=8)
    distiller = C.make_distiller(student, teacher, temperature=2.0, alpha=1.0)
    batch = {**seq_batch(128), "y": torch.randint(0, 2, (128,)).float()}
    opt = distiller.configure_optimizers()
    first = float(distiller.loss(batch)[1])
    for _ in range(60):
        opt.zero_grad()
        distiller.loss(batch)[0].backward()
        opt.step()
    assert float(distiller.loss(batch)[1]) < first
    assert all(not p.requires_grad for p in distiller.teacher.parameters())
    assert C.param_count(student) < C.param_count(teacher)


def test_onnx_two_head_sensor_model_parity_per_output(tmp_path: Path) -> None:
    from tests.unit.test_compress_quant import sensor_batch, tiny_sensor

    torch.manual_seed(0)
    model = tiny_sensor()  # conv + BatchNorm + GELU encoder, (batch, 2) output: RUL head, failure logit
    path, names = C.export_onnx(model, sensor_batch(2), tmp_path / "sensor.onnx", input_names=["x"])
    held_out = [sensor_batch(1, seed=3), sensor_batch(45, seed=4)]  # other batch sizes than the export's
    parity = C.check_onnx_parity(model, path, held_out, names, atol=1e-5)
    assert parity.passed and parity.n == 46
    assert len(parity.max_abs_diff_per_output) == 2 and max(parity.max_abs_diff_per_output) == parity.max_abs_diff
    got = C.onnx_predict(C.onnx_session(path), held_out, names)
    assert got.shape == (46, 2)
