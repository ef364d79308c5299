"""Early stopping on a smoothed validation metric (``TrainSpec.smoothing``), and the
learning-rate schedule of the sensor RUL model, on tiny data (CPU, no Prefect)."""

from __future__ import annotations

import itertools
import math

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from solutions.sensor.model import SensorRULModel, WindowDataModule, lr_factor
from tasks.train import TrainSpec, smoothed_name, train_model


class Noisy(L.LightningModule):
    """A model whose validation loss is a fixed noisy sequence: early stopping on the raw
    value stops at the first bump, on the smoothed value it does not."""

    SEQUENCE = (1.0, 0.8, 0.9, 0.6, 0.7, 0.5, 0.55, 0.45, 0.5, 0.6, 0.7, 0.8)

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def training_step(self, batch, i):
        return (self.w - 1.0).pow(2).sum()

    def validation_step(self, batch, i):
        self.log("val/loss", torch.tensor(self.SEQUENCE[min(self.current_epoch, len(self.SEQUENCE) - 1)]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=4)


class Seen(Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_validation_end(self, trainer, pl_module) -> None:
        self.values.append(float(trainer.callback_metrics[smoothed_name("val/loss")]))


def test_smoothed_early_stopping_outlasts_the_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDUSFLOW_TRAIN_NUM_THREADS", "1")
    raw = train_model(Noisy(), Data(), TrainSpec(run_key="smooth-raw", max_epochs=12, patience=1))
    assert raw.epochs_trained_now == [0, 1, 2]  # the raw metric stops at the first bump
    seen = Seen()
    smooth = train_model(Noisy(), Data(), TrainSpec(run_key="smooth-ema", max_epochs=12, patience=2, smoothing=0.6),
                         callbacks=[seen])
    assert smooth.monitor == "val/loss_smooth"
    avg, expected = 0.0, []
    for i, v in enumerate(Noisy.SEQUENCE[: len(seen.values)], start=1):  # bias-corrected moving average
        avg = 0.6 * avg + 0.4 * v
        expected.append(avg / (1 - 0.6**i))
    assert seen.values == pytest.approx(expected, rel=1e-5)
    assert len(smooth.epochs_trained_now) >= 10  # it trained through the noise, down to the 0.45 region
    assert smooth.best_score == pytest.approx(min(expected), rel=1e-5)
    assert "best-epoch=" in smooth.best_checkpoint and smooth.stopped_early


def test_cosine_schedule_factor() -> None:
    assert lr_factor(0, 100, "constant") == 1.0 and lr_factor(50, 0, "cosine") == 1.0
    ramp = [lr_factor(s, 100, "cosine", warmup=0.05) for s in range(5)]
    assert ramp == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lr_factor(5, 100, "cosine") == pytest.approx(1.0)
    assert lr_factor(99, 100, "cosine") == pytest.approx(0.01, abs=1e-3)
    decay = [lr_factor(s, 100, "cosine") for s in range(5, 100)]
    assert all(a >= b for a, b in itertools.pairwise(decay))
    with pytest.raises(ValueError, match="unknown lr_schedule"):
        SensorRULModel(3, channels=8, lr_schedule="linear")


def test_rul_model_follows_the_cosine_schedule_and_adds_noise_only_in_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDUSFLOW_TRAIN_NUM_THREADS", "1")  # tiny convolutions: one thread is fastest
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3, 10)).astype("float32")
    rul = rng.uniform(0, 125, size=64)
    fail = (rul < 30).astype("float64")
    model = SensorRULModel(3, channels=8, embedding_dim=16, lr=1e-2, lr_schedule="cosine", input_noise=0.5,
                           pooling="meanlast")
    seen: list[float] = []

    class Rates(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, i) -> None:
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    dm = WindowDataModule((x, rul, fail), (x, rul, fail), batch_size=16)
    train_model(model, dm, TrainSpec(run_key="cosine-rul", max_epochs=3, patience=5), callbacks=[Rates()])
    total = 3 * 4
    assert len(seen) == total
    assert seen == pytest.approx([1e-2 * lr_factor(s, total, "cosine", 0.05) for s in range(total)])
    assert seen[-1] < 0.02 * 1e-2 * 10 and math.isclose(max(seen), 1e-2)
    model.eval()
    with torch.no_grad():  # evaluation sees the windows as they are: two calls agree
        a, b = model(torch.as_tensor(x)), model(torch.as_tensor(x))
    assert torch.equal(a[0], b[0])
