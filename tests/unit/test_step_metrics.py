"""LeanSteps: manual optimisation trains to the same weights as Lightning's automatic one
(gradient clipping included), training metrics accumulated as tensors and logged once per epoch
give what Lightning's per-step ``self.log(on_epoch=True)`` gave, and the batch transfer on the CPU
is a no-op."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from infra.compute import HardwareRequest, resolve_training
from infra.step_metrics import EpochMeans, LeanSteps
from tasks.curves import read_curves
from tasks.train import TrainSpec, train_model


class _Net(L.LightningModule):
    """Records each training step's loss and batch size; ``lean`` picks the logging path."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
        self.steps: list[list[tuple[float, int]]] = []

    def _loss(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        pred = self.net(x).squeeze(-1)
        return nn.functional.mse_loss(pred, y), (pred - y).abs().mean()

    def training_step(self, batch, batch_idx):
        loss, mae = self._loss(batch)
        if batch_idx == 0:
            self.steps.append([])
        self.steps[-1].append((float(loss.detach()), len(batch[0])))
        self._log_train(loss, mae, len(batch[0]))
        return self._finish(loss)

    def validation_step(self, batch, batch_idx):
        loss, _ = self._loss(batch)
        self.log("val/loss", loss, batch_size=len(batch[0]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class PerStepLogging(_Net):
    """Lightning's automatic optimisation and per-step logging."""

    def _finish(self, loss):
        return loss

    def _log_train(self, loss, mae, n) -> None:
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=n)
        self.log("train/mae", mae, prog_bar=True, on_step=False, on_epoch=True, batch_size=n)


class EpochLogging(LeanSteps, _Net):
    def _finish(self, loss):
        return self.optimize(loss)

    def _log_train(self, loss, mae, n) -> None:
        self.log_epoch_mean("train/loss", loss, n)
        self.log_epoch_mean("train/mae", mae, n, prog_bar=True)


class SeenAtEpochEnd(Callback):
    """What a callback reads from ``trainer.callback_metrics`` at each training epoch's end."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.seen.append({k: float(v) for k, v in trainer.callback_metrics.items()})


class _Data(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(250, 6, generator=g)  # 250 = 3 x 64 + 58: the last batch is smaller
        y = x[:, 0] - 0.5 * x[:, 1] + 0.1 * torch.randn(250, generator=g)
        self.train, self.val = TensorDataset(x[:250], y[:250]), TensorDataset(x[:64], y[:64])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(2))

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=64)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _fit(module: L.LightningModule, key: str, **spec) -> tuple[SeenAtEpochEnd, object]:
    seen = SeenAtEpochEnd()
    hw = resolve_training(request=HardwareRequest(accelerator="cpu", devices=1, num_threads=1))
    spec = {"max_epochs": 3, "patience": 9, **spec}
    result = train_model(module, _Data(), TrainSpec(run_key=key, fresh=True, hardware=hw, **spec), callbacks=[seen])
    return seen, result


def test_epoch_means_weight_by_batch_size() -> None:
    means = EpochMeans()
    means.add("a", torch.tensor(1.0), 3)
    means.add("a", torch.tensor(4.0), 1, prog_bar=True)
    means.add("b", torch.tensor(2, dtype=torch.int64), 2)  # integers are averaged as floats
    out = means.pop()
    assert float(out["a"][0]) == pytest.approx((3 * 1.0 + 4.0) / 4) and out["a"][1] is True
    assert out["b"][0].dtype == torch.float32 and float(out["b"][0]) == 2.0
    assert not means and means.pop() == {}


def test_epoch_logging_equals_lightning_per_step_logging_and_the_step_mean() -> None:
    ref_module, lean_module = PerStepLogging(), EpochLogging()
    per_step, per_step_result = _fit(ref_module, "lean-ref")
    assert not lean_module.automatic_optimization
    lean, lean_result = _fit(lean_module, "lean-new")
    # the same training: manual optimisation takes the same steps (clipped at TrainSpec's default 1.0) ...
    ref_curves, lean_curves = (read_curves(Path(r.curves_csv)) for r in (per_step_result, lean_result))
    assert [r["val/loss"] for r in lean_curves] == [r["val/loss"] for r in ref_curves]
    assert [r["grad_norm"] for r in lean_curves] == [r["grad_norm"] for r in ref_curves]  # before clipping
    assert all(torch.equal(a, b) for a, b in zip(_weights(ref_module).values(), _weights(lean_module).values()))
    assert len(lean.seen) == 3 and len(lean_module.steps) == 3
    for epoch, (ref, new, steps) in enumerate(zip(per_step.seen, lean.seen, lean_module.steps)):
        # ... and every epoch-end callback sees this epoch's means, equal to Lightning's own
        assert new["train/loss"] == ref["train/loss"] and new["train/mae"] == ref["train/mae"], epoch
        weighted = sum(v * n for v, n in steps) / sum(n for _, n in steps)
        assert new["train/loss"] == pytest.approx(weighted, rel=1e-6)
        assert [n for _, n in steps] == [64, 64, 64, 58]
    assert lean_result.metrics["train/loss"] == per_step_result.metrics["train/loss"]


@pytest.mark.parametrize("clip", [1e-3, None])
def test_manual_steps_clip_like_automatic_optimisation(clip: float | None) -> None:
    ref, lean = PerStepLogging(), EpochLogging()
    _fit(ref, f"lean-clip-ref-{clip}", gradient_clip_val=clip, max_epochs=1)
    _fit(lean, f"lean-clip-new-{clip}", gradient_clip_val=clip, max_epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(_weights(ref).values(), _weights(lean).values()))
    if clip is None:  # clipping at 1e-3 changed the weights: the clip was applied, not skipped
        clipped = EpochLogging()
        _fit(clipped, "lean-clip-small", gradient_clip_val=1e-3, max_epochs=1)
        assert not torch.equal(_weights(clipped)["net.0.weight"], _weights(lean)["net.0.weight"])


class _WithScheduler(EpochLogging):
    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}


def test_lean_steps_refuse_a_lightning_scheduler_they_would_not_step() -> None:
    with pytest.raises(ValueError, match="does not step Lightning learning-rate schedulers"):
        _fit(_WithScheduler(), "lean-sched", max_epochs=1)
    with pytest.raises(ValueError, match="positive norm"):
        EpochLogging().clip_gradients_at(0.0)


def test_epoch_means_cover_a_limited_epoch() -> None:
    module = EpochLogging()
    seen, _ = _fit(module, "lean-limited", limit_train_batches=2)
    assert [len(s) for s in module.steps] == [2, 2, 2]
    for metrics, steps in zip(seen.seen, module.steps):
        assert metrics["train/loss"] == pytest.approx(sum(v for v, _ in steps) / 2, rel=1e-6)


def test_cpu_batch_transfer_is_a_no_op_and_other_batches_still_move() -> None:
    module = EpochLogging()
    cpu = torch.device("cpu")
    batch = (torch.ones(2), torch.zeros(2))
    assert module.transfer_batch_to_device(batch, cpu, 0) is batch
    as_dict = {"x": torch.ones(2), "y": torch.zeros(2)}
    assert module.transfer_batch_to_device(as_dict, cpu, 0) is as_dict
    nested = {"x": [torch.ones(2)], "n": 3}  # not flat: Lightning's transfer, same values
    moved = module.transfer_batch_to_device(nested, cpu, 0)
    assert moved["n"] == 3 and torch.equal(moved["x"][0], torch.ones(2))
