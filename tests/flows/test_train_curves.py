"""Live training curves: one markdown artifact per training (chart + table), in the Prefect API
while the training runs and updated in place per epoch; a progress artifact that reaches 100."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from prefect import flow
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tasks.curves import CURVES_PNG, curves_artifact_key, parse_curves_table, read_curves
from tasks.train import TrainSpec, train_model_task


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def _loss(self, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.binary_cross_entropy_with_logits(self.net(x).squeeze(-1), y)

    def training_step(self, batch, i):
        return self._loss(batch)

    def validation_step(self, batch, i):
        self.log("val/loss", self._loss(batch))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


class Data(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 6, generator=g)
        y = (x[:, 0] > 0).float()
        self.train_set, self.val_set = TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=32, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=64)


def curves_artifacts(key: str) -> list:
    """Every artifact stored under ``key`` (every version), read back through the Prefect client."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def read_curves_artifact(key: str) -> list[dict]:
    """The rows of the one curves artifact under ``key`` (fails when there are several)."""
    arts = curves_artifacts(key)
    assert len(arts) == 1, f"{len(arts)} artifacts under {key}"
    assert arts[0].type == "markdown"
    return parse_curves_table(arts[0].data)


def progress_of(flow_run_id) -> list[float]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            type=ArtifactFilterType(any_=["progress"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return [float(a.data) for a in arts]


class ReadMidRun(Callback):
    """Reads the curves artifact back at the end of epoch ``at`` (the training still running)."""

    def __init__(self, key: str, at: int) -> None:
        self.key, self.at, self.seen = key, at, None

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.at:
            self.seen = read_curves_artifact(self.key)


def test_curves_reach_the_api_while_training_runs(tmp_path: Path) -> None:
    spec = TrainSpec(run_key="curves-live", max_epochs=4, patience=9)
    probe = ReadMidRun(curves_artifact_key(spec.run_key), at=1)

    @flow(name="curves-probe")
    def run():
        from prefect.runtime import flow_run

        return train_model_task(Tiny(), Data(), spec, callbacks=[probe]), flow_run.id

    result, run_id = run()
    # mid-run (end of epoch 2 of 4) the UI already had one row per finished epoch
    assert probe.seen is not None and [r["epoch"] for r in probe.seen] == [0, 1]
    first = probe.seen[0]
    assert first["lr"] == 1e-2 and probe.seen[1]["lr"] == 5e-3  # the schedule is visible
    assert first["grad_norm"] > 0 and first["train/loss"] > 0 and first["val/loss"] > 0
    # after the run: still ONE artifact (updated in place), with every epoch and the chart
    assert [r["epoch"] for r in read_curves_artifact(probe.key)] == [0, 1, 2, 3]
    markdown = curves_artifacts(probe.key)[0].data
    assert "Done: 4 epoch(s) trained." in markdown and "so far" not in markdown  # the fit's end is its last state
    image = re.search(r"!\[training curves\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
    assert image is not None and base64.b64decode(image.group(1))[:8] == b"\x89PNG\r\n\x1a\n"
    # the CSV and the same chart beside the checkpoint too
    rows = read_curves(Path(result.curves_csv))
    assert Path(result.curves_csv).parent == Path(result.checkpoint_dir)
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["train/loss"] == first["train/loss"]
    assert (Path(result.checkpoint_dir) / CURVES_PNG).read_bytes() == base64.b64decode(image.group(1))
    # the epochs' progress artifact reached 100
    assert progress_of(run_id) == [100.0]
