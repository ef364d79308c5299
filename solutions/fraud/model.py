"""The fraud sequence model (GRU over the account's recent transactions) and its data."""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Sampler

from infra.determinism import epoch_rng
from solutions.fraud.sequences import FraudArrays, SequenceDataset, collate_batch


def focal_loss(logits: torch.Tensor, y: torch.Tensor, gamma: float, alpha: float = 0.25) -> torch.Tensor:
    """Binary focal loss (Lin et al. 2017): down-weights easy examples."""
    bce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    p = torch.sigmoid(logits)
    p_t = p * y + (1 - p) * (1 - y)
    alpha_t = alpha * y + (1 - alpha) * (1 - y)
    return (alpha_t * (1 - p_t) ** gamma * bce).mean()


class FraudSequenceModel(L.LightningModule):
    """Sequence embedding (GRU) + static/context features -> MLP -> fraud logit.

    Args:
        n_step_numeric: numeric features per step (present flag included).
        cardinalities: embedding sizes for ``channel``, ``category``, ``occupation``.
        n_context_numeric: static + window features of the scored transaction.
        hidden: GRU size. mlp_hidden: first MLP width. dropout: MLP dropout.
        lr, weight_decay: AdamW. loss: ``bce`` (with ``pos_weight``) or ``focal``.
    """

    def __init__(
        self,
        n_step_numeric: int,
        cardinalities: dict[str, int],
        n_context_numeric: int,
        hidden: int = 64,
        mlp_hidden: int = 128,
        dropout: float = 0.1,
        lr: float = 2e-3,
        weight_decay: float = 1e-4,
        loss: str = "bce",
        focal_gamma: float = 2.0,
        pos_weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        card = {k: max(1, int(v)) for k, v in cardinalities.items()}
        self.channel_emb = nn.Embedding(card.get("channel", 1), 4)
        self.category_emb = nn.Embedding(card.get("category", 1), 8)
        self.occupation_emb = nn.Embedding(card.get("occupation", 1), 4)
        self.step_proj = nn.Sequential(nn.Linear(n_step_numeric + 4 + 8, hidden), nn.ReLU())
        self.encoder = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(hidden + n_context_numeric + 4, mlp_hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_hidden, 32),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(32, 1),
        )
        self._outputs: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        steps = torch.cat(
            [
                batch["step_num"],
                self.channel_emb(batch["step_cat"][..., 0]),
                self.category_emb(batch["step_cat"][..., 1]),
            ],
            dim=-1,
        )
        _, h = self.encoder(self.step_proj(steps))
        ctx = torch.cat(
            [h[-1], batch["ctx_num"], self.occupation_emb(batch["ctx_cat"][:, 0])], dim=-1
        )
        return self.head(ctx).squeeze(-1)

    def _loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.hparams.loss == "focal":
            return focal_loss(logits, y, self.hparams.focal_gamma)
        weight = torch.as_tensor(self.hparams.pos_weight, device=logits.device, dtype=logits.dtype)
        return F.binary_cross_entropy_with_logits(logits, y, pos_weight=weight)

    def _step(self, batch: dict[str, torch.Tensor], stage: str) -> torch.Tensor:
        logits = self(batch).float()
        loss = self._loss(logits, batch["y"])
        self.log(f"{stage}/loss", loss, prog_bar=stage != "train", on_step=False, on_epoch=True,
                 batch_size=len(logits))
        if stage != "train":
            self._outputs.setdefault(stage, []).append((logits.detach().cpu(), batch["y"].cpu()))
        return loss

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def _epoch_auprc(self, stage: str) -> None:
        from sklearn.metrics import average_precision_score

        outputs = self._outputs.pop(stage, [])
        if not outputs:
            return
        scores = torch.cat([o[0] for o in outputs]).numpy()
        y = torch.cat([o[1] for o in outputs]).numpy()
        if 0 < y.sum() < len(y):
            self.log(f"{stage}/auprc", float(average_precision_score(y, scores)), prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self._epoch_auprc("val")

    def on_test_epoch_end(self) -> None:
        self._epoch_auprc("test")

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return torch.sigmoid(self(batch).float())

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


class NegativeSubsampler(Sampler[int]):
    """Each epoch: every positive plus a fresh random share ``rate`` of the negatives, shuffled.

    Fraud data is ~99% legit; seeing a new subset of legit transactions every epoch cuts
    the cost of an epoch by about ``1/rate`` while every negative is still seen over
    several epochs. With ``rate`` 1 it is a seeded shuffle of every row.

    Epoch ``e`` draws from a generator seeded with ``(seed, e)`` (Lightning calls
    :meth:`set_epoch`), so a run resumed at epoch ``e`` sees what an uninterrupted run sees.
    """

    def __init__(self, labels: np.ndarray, rate: float, seed: int = 0) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"negative sampling rate must be in (0, 1], got {rate}")
        labels = np.nan_to_num(np.asarray(labels, dtype="float64"), nan=0.0)
        self.pos = np.flatnonzero(labels > 0.5)
        self.neg = np.flatnonzero(labels <= 0.5)
        self.n_neg = max(1, round(rate * len(self.neg))) if len(self.neg) else 0
        self.seed = seed
        self.epoch = 0
        self._epoch_set = False

    def set_epoch(self, epoch: int) -> None:
        """Draw the samples of ``epoch`` next (called by Lightning before each epoch)."""
        self.epoch, self._epoch_set = int(epoch), True

    def __len__(self) -> int:
        return len(self.pos) + self.n_neg

    def __iter__(self):
        rng = epoch_rng(self.seed, self.epoch)
        if not self._epoch_set:  # a plain loop without set_epoch: next epoch next time
            self.epoch += 1
        self._epoch_set = False
        neg = rng.choice(self.neg, size=self.n_neg, replace=False) if self.n_neg else self.neg
        order = np.concatenate([self.pos, neg])
        rng.shuffle(order)
        return iter(order.tolist())


class FraudDataModule(L.LightningDataModule):
    """Train / val / test / predict loaders over one table's arrays.

    Args:
        arrays: arrays of the whole table (history rows included, for sequences).
        splits: sorted-row indices per stage name (``train``, ``val``, ``test``, ``predict``).
    """

    def __init__(
        self,
        arrays: FraudArrays,
        splits: dict[str, np.ndarray],
        seq_len: int,
        batch_size: int = 512,
        negative_rate: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.arrays = arrays
        self.splits = splits
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.negative_rate = negative_rate
        self.seed = seed

    def _loader(self, stage: str, shuffle: bool = False) -> DataLoader:
        if stage not in self.splits:
            raise KeyError(f"no {stage!r} split; have {sorted(self.splits)}")
        dataset = SequenceDataset(self.arrays, self.splits[stage], self.seq_len)
        return DataLoader(
            dataset, batch_size=self.batch_size, shuffle=shuffle, collate_fn=collate_batch
        )

    def train_dataloader(self) -> DataLoader:
        dataset = SequenceDataset(self.arrays, self.splits["train"], self.seq_len)
        labels = self.arrays.label[torch.as_tensor(self.splits["train"])].numpy()
        sampler = NegativeSubsampler(labels, self.negative_rate, self.seed)
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, collate_fn=collate_batch)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")


def predict_scores(model: FraudSequenceModel, dm: FraudDataModule, stage: str, batch_size: int = 2048) -> np.ndarray:
    """Fraud probabilities for a split, in the split's index order (no Trainer needed)."""
    dataset = SequenceDataset(dm.arrays, dm.splits[stage], dm.seq_len)
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_batch)
    model.eval()
    out = []
    with torch.inference_mode():
        for batch in loader:
            batch = {k: v.to(model.device) for k, v in batch.items()}
            out.append(torch.sigmoid(model(batch).float()).cpu())
    return torch.cat(out).numpy() if out else np.zeros(0, dtype="float32")


def build_module(params: dict) -> FraudSequenceModel:
    """A fresh fp32 fraud sequence model from registry params (weights loaded by the caller)."""
    if params.get("architecture") != "FraudSequenceModel":
        raise ValueError(f"not a fraud sequence model: {params.get('architecture')!r}")
    return FraudSequenceModel(**params["hparams"])
