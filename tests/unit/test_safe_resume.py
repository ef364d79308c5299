"""Resuming from ``last.ckpt`` reads tensors only: a checkpoint carrying pickled code is refused."""

from __future__ import annotations

import pickle
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tasks.train import TrainSpec, checkpoint_dir, train_model


def _touch_mark(path: str) -> None:
    Path(path).write_text("code ran while loading a checkpoint")


class Payload:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # what a crafted checkpoint would do when unpickled
        return (_touch_mark, (self.path,))


class Small(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, i):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x).squeeze(-1), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SmallData(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32)), batch_size=16)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16)), batch_size=16)


def test_resume_refuses_a_checkpoint_that_would_run_code(tmp_path: Path) -> None:
    mark = tmp_path / "pwned"
    spec = TrainSpec(run_key="crafted-resume", max_epochs=2, patience=5, monitor="val/loss", mode="min")
    folder = checkpoint_dir(spec.run_key)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "epoch": 0, "global_step": 0, "payload": Payload(mark)}, folder / "last.ckpt")
    with pytest.raises(pickle.UnpicklingError, match="[Ww]eights only"):
        train_model(Small(), SmallData(), spec)
    assert not mark.exists()
