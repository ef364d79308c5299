"""The generic train task with ``strategy="ddp"`` on two CPU processes (gloo).

This is the path a multi-GPU or multi-node work pool takes (Lightning launches one process
per device and shards the data with a DistributedSampler), proven here without GPUs: both
ranks train on disjoint halves of the data, and a killed run resumes from ``last.ckpt``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = r'''
import json, os, sys
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from infra.resources import TrainerArgs
from tasks.train import TrainSpec, train_model

OUT = Path(sys.argv[1])
N = 96


class Indexed(Dataset):
    """Each sample carries its own index, so a rank can say which samples it saw."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x[:, 0] > 0).float()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.seen = []

    def _loss(self, batch):
        x, y, _ = batch
        return nn.functional.binary_cross_entropy_with_logits(self.net(x).squeeze(-1), y)

    def training_step(self, batch, i):
        self.seen += [int(j) for j in batch[2]]
        return self._loss(batch)

    def validation_step(self, batch, i):
        self.log("val/loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self):
        name = f"seen-rank{self.global_rank}-of{self.trainer.world_size}-max{MAX_EPOCHS}.json"
        (OUT / name).write_text(json.dumps(self.seen))


class D(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(Indexed(N), batch_size=8, shuffle=True)

    def val_dataloader(self):
        return DataLoader(Indexed(32), batch_size=16)


hw = TrainerArgs(accelerator="cpu", devices=2, strategy="ddp", precision="32-true", num_threads=1)
rank0 = int(os.environ.get("LOCAL_RANK", "0")) == 0
# -- two epochs on two processes (Lightning starts rank 1 by re-running this script)
MAX_EPOCHS = 2
first = train_model(M(), D(), TrainSpec(run_key="ddp-two", max_epochs=2, patience=9, hardware=hw))
if rank0:
    (OUT / "result-max2.json").write_text(first.model_dump_json())
# -- the same run key with a third epoch: the call resumes from last.ckpt
MAX_EPOCHS = 3
resumed = train_model(M(), D(), TrainSpec(run_key="ddp-two", max_epochs=3, patience=9, hardware=hw))
if rank0:
    (OUT / "result-max3.json").write_text(resumed.model_dump_json())
'''


def _run(script: Path, out: Path, env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), str(out)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.slow  # two training processes and their gloo group (~15 CPU-s): make test, not make test-fast
def test_ddp_two_cpu_processes_shard_data_and_resume(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / "train_ddp.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    home = tmp_path / "home"
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "INDUSFLOW_HOME": str(home),
        "OMP_NUM_THREADS": "1",
    }
    _run(script, out, env, repo)  # trains 2 epochs, drops the result file, resumes to 3 epochs
    first = json.loads((out / "result-max2.json").read_text())
    assert first["epochs_trained_now"] == [0, 1] and first["accelerator"] == "cpu"
    seen0 = json.loads((out / "seen-rank0-of2-max2.json").read_text())
    seen1 = json.loads((out / "seen-rank1-of2-max2.json").read_text())
    # a DistributedSampler gave each rank half of each epoch's samples, never the same ones
    assert len(seen0) == len(seen1) == 2 * 48
    for epoch in range(2):
        part0, part1 = set(seen0[48 * epoch:48 * (epoch + 1)]), set(seen1[48 * epoch:48 * (epoch + 1)])
        assert not part0 & part1, "both ranks trained on the same samples"
        assert part0 | part1 == set(range(96))
    ckpt_dir = Path(first["checkpoint_dir"])
    assert (ckpt_dir / "last.ckpt").exists()
    # -- a run killed after its last checkpoint (no result file yet) resumes on both ranks
    resumed = json.loads((out / "result-max3.json").read_text())
    assert resumed["resumed_from_epoch"] == 2 and resumed["epochs_trained_now"] == [2]
    assert resumed["epochs_completed"] == 3
    for rank in (0, 1):
        assert len(json.loads((out / f"seen-rank{rank}-of2-max3.json").read_text())) == 48
