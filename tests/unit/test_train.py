"""The generic train and fine-tune tasks on a tiny Lightning model (CPU, no Prefect)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from infra.compute import HardwareRequest, resolve_training
from infra.hardware import auto_precision
from tasks.curves import read_curves
from tasks.finetune import finetune_model, freeze_all_but_top
from tasks.train import TrainSpec, checkpoint_dir, train_model


class Tiny(L.LightningModule):
    def __init__(self, n_in: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(n_in, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).squeeze(-1)

    def _step(self, batch, stage: str) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self(x), y)
        self.log(f"{stage}/loss", loss)
        return loss

    def training_step(self, batch, i):
        return self._step(batch, "train")

    def validation_step(self, batch, i):
        self._step(batch, "val")

    def configure_optimizers(self):
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=1e-2)


class Data(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(512, 8, generator=g)
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).float()
        self.train, self.val = TensorDataset(x[:384], y[:384]), TensorDataset(x[384:], y[384:])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=64, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=128)


class FailAtEpoch(Callback):
    """Simulates a crash at the start of an epoch (after the previous one was checkpointed)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise RuntimeError(f"simulated crash at epoch {self.epoch}")


def test_train_returns_result_and_best_weights() -> None:
    module = Tiny()
    result = train_model(module, Data(), TrainSpec(run_key="tiny-basic", max_epochs=3, patience=5))
    assert result.epochs_completed == 3 and result.epochs_trained_now == [0, 1, 2]
    assert result.precision == "32-true" and result.accelerator == "cpu"
    assert result.best_checkpoint and Path(result.best_checkpoint).exists()
    assert (checkpoint_dir("tiny-basic") / "last.ckpt").exists()
    assert result.samples_per_s and result.samples_per_s > 0
    assert result.metrics["val/loss"] < 0.69  # learnt something
    # a plain re-run of a finished key resumes from last.ckpt and trains nothing (inside a flow
    # Prefect's cache skips it altogether: tests/flows/test_cached_training.py)
    again_model = Tiny()
    again = train_model(again_model, Data(), TrainSpec(run_key="tiny-basic", max_epochs=3, patience=5))
    assert again.epochs_trained_now == [] and again.best_checkpoint == result.best_checkpoint
    assert all(torch.equal(a, b) for a, b in zip(again_model.state_dict().values(), module.state_dict().values()))


def test_a_run_that_stopped_early_stays_stopped_when_run_again() -> None:
    spec = TrainSpec(run_key="tiny-stopped", max_epochs=30, patience=1, monitor="train/loss")
    first = train_model(Tiny(), Data(), spec)
    assert first.stopped_early and first.epochs_completed < 30
    (checkpoint_dir("tiny-stopped") / "train_result.json").unlink()  # the record is for people, not for resuming
    again = train_model(Tiny(), Data(), spec)
    assert again.epochs_trained_now == [] and again.stopped_early  # Lightning alone would train on
    assert again.best_checkpoint == first.best_checkpoint


def test_interrupted_training_resumes_from_last_ckpt() -> None:
    spec = TrainSpec(run_key="tiny-resume", max_epochs=5, patience=10)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_model(Tiny(), Data(), spec, callbacks=[FailAtEpoch(3)])
    assert (checkpoint_dir("tiny-resume") / "last.ckpt").exists()
    resumed = train_model(Tiny(), Data(), spec)
    assert resumed.resumed_from_epoch == 3
    assert resumed.epochs_trained_now == [3, 4], "epochs before the crash must not be retrained"
    assert resumed.epochs_completed == 5
    # the curves of the whole training, one row per epoch, the crashed call's rows kept
    rows = read_curves(Path(resumed.curves_csv))
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3, 4]
    assert all(r["lr"] == pytest.approx(1e-2) and r["grad_norm"] > 0 and r["train/loss"] > 0 for r in rows)
    assert all(r["val/loss"] is not None for r in rows) and rows[-1]["val/loss"] < rows[0]["train/loss"]
    fresh = train_model(Tiny(), Data(), spec.model_copy(update={"fresh": True}))
    assert fresh.epochs_trained_now == [0, 1, 2, 3, 4] and fresh.resumed_from_epoch is None


def test_precision_follows_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    assert auto_precision("cpu") == "32-true"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert auto_precision("auto") == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert auto_precision("auto") == "16-mixed"
    assert auto_precision("cpu") == "32-true"
    monkeypatch.setenv("INDUSFLOW_TRAIN_PRECISION", "bf16-mixed")
    assert resolve_training().precision == "bf16-mixed"
    assert resolve_training(request=HardwareRequest(precision="32-true")).precision == "32-true"


def test_freeze_top_fraction_counts_parameters() -> None:
    module = Tiny()
    report = freeze_all_but_top(module, 0.10)
    total = sum(p.numel() for p in module.parameters())
    assert report.total_params == total
    assert 0 < report.trainable_params <= 0.10 * total
    assert sorted(report.trainable_tensors) == ["head.bias", "head.weight"]
    assert all(not p.requires_grad for p in module.body.parameters())


def test_finetune_top_changes_only_trainable_weights() -> None:
    module = Tiny()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    result = finetune_model(module, Data(), TrainSpec(run_key="tiny-ft", max_epochs=2, patience=5), fraction=0.1)
    after = module.state_dict()
    assert result.freeze.trainable_params == 65
    assert torch.equal(before["body.0.weight"], after["body.0.weight"])
    assert not torch.equal(before["head.weight"], after["head.weight"])


def test_progressive_unfreezing_callback() -> None:
    module = Tiny()
    result = finetune_model(
        module,
        Data(),
        TrainSpec(run_key="tiny-prog", max_epochs=3, patience=5),
        mode="progressive",
        groups=["head", "body.2", "body.0"],
        every_n_epochs=1,
    )
    assert result.freeze.trainable_params == sum(p.numel() for p in module.parameters())
    with pytest.raises(AttributeError):
        finetune_model(Tiny(), Data(), TrainSpec(run_key="tiny-prog2"), mode="progressive", groups=["nope"])


@pytest.mark.parametrize(("ratio", "expected"), [(None, 0.1), (1.0, 1.0)])
def test_progressive_unfreezing_rate_of_unfrozen_groups(ratio: float | None, expected: float) -> None:
    """Groups unfrozen later train at ``unfrozen_lr_ratio`` x the current rate (Lightning's 0.1 by default)."""
    module = Tiny()
    rates: list[list[float]] = []

    class Rates(Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            rates.append([g["lr"] for g in trainer.optimizers[0].param_groups])

    kw = {} if ratio is None else {"unfrozen_lr_ratio": ratio}
    finetune_model(module, Data(), TrainSpec(run_key=f"tiny-rate-{ratio}", max_epochs=2, patience=5),
                   mode="progressive", groups=["head", "body"], every_n_epochs=1, callbacks=[Rates()], **kw)
    assert len(rates[0]) == 1 and len(rates[1]) == 2  # body joined the optimiser at epoch 1
    assert rates[1][1] == pytest.approx(expected * rates[1][0])
    with pytest.raises(ValueError, match="unfrozen_lr_ratio"):
        finetune_model(Tiny(), Data(), TrainSpec(run_key="tiny-rate-bad"), mode="progressive", groups=["head"],
                       unfrozen_lr_ratio=0.0)


# as in a CLI run: Prefect (and its root console handler) is imported before Lightning
_CLI_LIKE_TRAINING = """
from infra.prefect_env import prefect_cli_settings
from tasks.train import TrainSpec, train_model
import lightning as L, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
    def training_step(self, batch, i):
        return self.net(batch[0]).pow(2).mean()
    def validation_step(self, batch, i):
        self.log("val/loss", self.net(batch[0]).pow(2).mean())
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

class D(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=16)
    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=16)

with prefect_cli_settings():
    train_model(M(), D(), TrainSpec(run_key="console-once", max_epochs=1))
"""


@pytest.mark.slow
def test_cli_like_run_prints_each_lightning_line_once(tmp_path: Path) -> None:
    """Lightning's own console handler and Prefect's root console handler both printed each
    line (``INFO: GPU available...`` and the same through Prefect): each line once now."""
    import os
    import re
    import subprocess
    import sys
    from collections import Counter

    env = {
        **os.environ,
        "INDUSFLOW_HOME": str(tmp_path / "home"),
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    done = subprocess.run(
        [sys.executable, "-c", _CLI_LIKE_TRAINING],
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # "12:00:00.000 | INFO    | lightning.pytorch... - GPU available" and "INFO: GPU available"
    # are the same line: compare the messages without their prefixes
    messages = [
        re.sub(r"^(\d\d:\d\d:\d\d\.\d+ \| \w+ +\| [\w.]+ - |[A-Z]+: )", "", line)
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip()
    ]
    assert any(m.startswith("GPU available") for m in messages), messages
    repeated = {m: n for m, n in Counter(messages).items() if n > 1}
    assert not repeated, f"printed more than once: {repeated}"


class Overfit(Tiny):
    """Validation loss that only rises after the first epoch (no new best checkpoint after epoch 0)."""

    def validation_step(self, batch, i):
        self.log("val/loss", torch.tensor(float(self.current_epoch)))


def test_a_run_whose_validation_stopped_improving_resumes_from_its_latest_epoch() -> None:
    """last.ckpt follows every epoch, not only the epochs that set a new best (Lightning 2.6 saves
    save_last=True only beside a new top-k checkpoint): a crash at epoch 4 of a run whose best was
    epoch 0 resumes at epoch 4, not 1."""
    spec = TrainSpec(run_key="tiny-plateau", max_epochs=6, patience=10)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_model(Overfit(), Data(), spec, callbacks=[FailAtEpoch(4)])
    assert torch.load(checkpoint_dir("tiny-plateau") / "last.ckpt", weights_only=True)["epoch"] == 3
    resumed = train_model(Overfit(), Data(), spec)
    assert resumed.resumed_from_epoch == 4 and resumed.epochs_trained_now == [4, 5]
    assert resumed.best_checkpoint and Path(resumed.best_checkpoint).name == "best-epoch=000.ckpt"
