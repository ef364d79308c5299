"""Lightning's mixed-precision and ddp paths of the generic train task on CUDA (marked ``gpu``).

Skipped without a CUDA GPU (tests/conftest.py); ``bench/gpu_check.sh`` runs them where one is.
The models are the project's own (the sensor RUL model: convolutions and BatchNorm; the fraud
model: embeddings and a GRU), trained through ``tasks.train.train_model`` as the flows train them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from infra.resources import TrainerArgs
from tasks.train import TrainSpec, train_model

pytestmark = pytest.mark.gpu


def _cuda(precision: str, devices: int = 1, strategy: str = "auto") -> TrainerArgs:
    return TrainerArgs(accelerator="cuda", devices=devices, strategy=strategy, precision=precision,
                       deterministic=False)


def _sensor(seed: int = 0):
    from solutions.sensor.model import SensorRULModel, WindowDataModule

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2304, 6, 30)).astype("float32")
    rul = np.clip(60 + 40 * x[:, 0, -5:].mean(axis=1) + rng.normal(scale=5, size=len(x)), 0, 125).astype("float32")
    fail = (rul < 40).astype("float32")
    dm = WindowDataModule((x[:2048], rul[:2048], fail[:2048]), (x[2048:], rul[2048:], fail[2048:]), batch_size=64)
    torch.manual_seed(seed)
    return SensorRULModel(n_channels=6, channels=16, embedding_dim=32), dm


def _fraud(seed: int = 0):
    from infra.tables import assign_periods, time_split
    from solutions.fraud import pipeline as P
    from solutions.fraud.config import SequenceModelConfig
    from solutions.fraud.synthetic import generate_transactions

    df = generate_transactions(n_accounts=200, n_terminals=60, n_days=40, seed=seed)
    split = time_split(df["timestamp"], train_days=14, val_days=3, delay_days=7, test_days=7)
    periods = assign_periods(df["timestamp"], split)
    cfg = SequenceModelConfig()
    setup = P.sequence_setup(df, P.build_features(df, periods, 7), cfg)
    return P.build_model(setup.preprocessor, cfg, 3.0), setup.datamodule


def _finite_fp32_weights(module: torch.nn.Module) -> None:
    for name, p in module.named_parameters():
        assert p.dtype == torch.float32, name  # mixed precision keeps fp32 master weights
        assert torch.isfinite(p).all(), name


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "32-true"])
def test_sensor_model_trains_in_each_precision_on_cuda(precision: str) -> None:
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    module, dm = _sensor()
    mean_only = float(dm.val_ds.tensors[1].std())  # the RMSE of predicting the mean RUL
    result = train_model(module, dm, TrainSpec(run_key=f"gpu-sensor-{precision}", max_epochs=6, patience=9,
                                               monitor="val/rmse", fresh=True, hardware=_cuda(precision),
                                               gradient_clip_val=0.5))  # clipping after unscaling (16-mixed)
    assert result.accelerator == "cuda" and result.precision == precision
    assert math.isfinite(result.metrics["train/loss"]) and math.isfinite(result.metrics["val/rmse"])
    assert result.metrics["val/rmse"] < 0.8 * mean_only, (result.metrics, mean_only)  # it learnt the signal
    _finite_fp32_weights(module)


def test_fraud_model_trains_in_bf16_on_cuda() -> None:
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    module, dm = _fraud()
    result = train_model(module, dm, TrainSpec(run_key="gpu-fraud-bf16", max_epochs=2, patience=9, fresh=True,
                                               hardware=_cuda("bf16-mixed")))
    assert result.accelerator == "cuda" and result.precision == "bf16-mixed"
    assert math.isfinite(result.metrics["train/loss"]) and math.isfinite(result.metrics["val/loss"])
    _finite_fp32_weights(module)


_DDP_SCRIPT = r'''
import hashlib, json, sys
from pathlib import Path

import torch
from tasks.train import TrainSpec, train_model
from infra.resources import TrainerArgs

sys.path.insert(0, sys.argv[3])
from test_train_gpu import _sensor

OUT, DEVICES = Path(sys.argv[1]), int(sys.argv[2])
module, dm = _sensor()
hw = TrainerArgs(accelerator="cuda", devices=DEVICES, strategy="ddp", precision="bf16-mixed", deterministic=False)
result = train_model(module, dm, TrainSpec(run_key="gpu-ddp", max_epochs=2, patience=9, monitor="val/rmse",
                                           fresh=True, hardware=hw))
weights = b"".join(v.detach().cpu().float().numpy().tobytes() for _, v in sorted(module.state_dict().items()))
(OUT / f"rank{module.global_rank}.json").write_text(json.dumps(
    {"hash": hashlib.sha256(weights).hexdigest(), "world": module.trainer.world_size,
     "precision": result.precision, "val_rmse": result.metrics["val/rmse"]}))
'''


def test_ddp_bf16_on_the_gpus_of_this_machine(tmp_path: Path) -> None:
    """ddp over the machine's GPUs (two at most; one GPU: a one-process group on NCCL): every rank
    ends with the same weights (gradients all-reduced), trained in bf16-mixed."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    devices = min(2, torch.cuda.device_count())
    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / "ddp_gpu.py"
    script.write_text(_DDP_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(repo), "INDUSFLOW_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, str(script), str(out), str(devices), str(Path(__file__).parent)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert len(ranks) == devices and {r["world"] for r in ranks} == {devices}
    assert len({r["hash"] for r in ranks}) == 1, ranks
    assert ranks[0]["precision"] == "bf16-mixed" and math.isfinite(ranks[0]["val_rmse"])
