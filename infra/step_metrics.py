"""Training steps of a LightningModule at the cost of a plain PyTorch loop.

Two per-step costs of Lightning that a plain loop does not pay, measured on the sensor
bench (``bench/sensor_bench.py``, py-spy):

- ``self.log(..., on_epoch=True)`` in ``training_step`` moves Lightning's metric state to the
  value's device and updates it through several wrappers on every step (about 5% of a
  16 ms step). :class:`LeanSteps` sums the step values as detached tensors instead (no host
  sync) and logs each epoch mean once, after the epoch's last batch, so the callbacks that
  read ``trainer.callback_metrics`` at the epoch's end see it as before, under the same name
  and with the same value (the batch-size weighted mean Lightning computes).
- the batch transfer walks the batch with ``apply_to_collection`` and calls ``.to(device)``
  on every tensor; on the CPU, with a batch of CPU tensors, that changes nothing and
  :class:`LeanSteps` returns the batch as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class EpochMeans:
    """Batch-size weighted means of step values, accumulated as detached tensors.

    ``add`` keeps ``value * batch_size`` summed in the value's floating dtype (as
    Lightning's epoch reduction does), so :meth:`pop` gives Lightning's epoch mean.
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}
        self._prog_bar: dict[str, bool] = {}

    def add(self, name: str, value: torch.Tensor, batch_size: int, prog_bar: bool = False) -> None:
        """Add one step's ``value`` (a scalar tensor) computed over ``batch_size`` samples."""
        value = value.detach()
        if not torch.is_floating_point(value) or value.dtype not in (torch.float32, torch.float64):
            value = value.to(torch.get_default_dtype())
        weighted = value * batch_size
        self._sums[name] = self._sums[name] + weighted if name in self._sums else weighted
        self._counts[name] = self._counts.get(name, 0) + int(batch_size)
        self._prog_bar[name] = prog_bar

    def __bool__(self) -> bool:
        return bool(self._sums)

    def pop(self) -> dict[str, tuple[torch.Tensor, bool]]:
        """The means so far (``name -> (mean, prog_bar)``), and start over."""
        means = {name: (total / self._counts[name], self._prog_bar[name]) for name, total in self._sums.items()}
        self._sums, self._counts, self._prog_bar = {}, {}, {}
        return means


def _flat_cpu_batch(batch: Any) -> bool:
    """Whether ``batch`` is a tensor, or a flat tuple/list/dict of tensors, all on the CPU."""
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else (batch,)
    return all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in items)


class LeanSteps:
    """Mixin for a ``LightningModule`` (list it first): cheap training-step metrics and batch transfer.

    In ``training_step`` call :meth:`log_epoch_mean` instead of
    ``self.log(name, value, on_step=False, on_epoch=True, batch_size=n)``: the value is
    accumulated as a tensor and logged once per epoch as the same mean. Validation and test
    steps keep ``self.log`` (they are not on the training clock, and callbacks that monitor
    them read the metrics at their epoch's end).
    """

    _epoch_means: EpochMeans | None = None

    def log_epoch_mean(self, name: str, value: torch.Tensor, batch_size: int, prog_bar: bool = False) -> None:
        """Accumulate a training step's ``value`` over ``batch_size`` samples; the epoch's mean is
        logged as ``name`` (``on_epoch``) once the epoch's last batch has been trained."""
        if self._epoch_means is None:
            self._epoch_means = EpochMeans()
        self._epoch_means.add(name, value, batch_size, prog_bar)

    def _log_epoch_means(self) -> None:
        if not self._epoch_means:
            return
        for name, (mean, prog_bar) in self._epoch_means.pop().items():
            # one value per epoch, weight 1: Lightning's epoch mean of it is the value itself
            self.log(name, mean, prog_bar=prog_bar, on_step=False, on_epoch=True, batch_size=1)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # after the epoch's last batch (the epoch-end work, like validation, follows): the means go
        # to Lightning before any epoch-end hook reads trainer.callback_metrics
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and trainer.is_last_batch:
            self._log_epoch_means()
        super().on_train_batch_end(outputs, batch, batch_idx)  # type: ignore[misc]

    def on_train_epoch_start(self) -> None:
        if self._epoch_means is not None:
            self._epoch_means.pop()  # an interrupted epoch's values do not leak into the next
        super().on_train_epoch_start()  # type: ignore[misc]

    def on_train_epoch_end(self) -> None:
        # an epoch that ended before its last batch (max_steps, a stop signal) still logs its means
        self._log_epoch_means()
        super().on_train_epoch_end()  # type: ignore[misc]

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if device.type == "cpu" and _flat_cpu_batch(batch):
            return batch  # .to("cpu") of CPU tensors returns them unchanged
        return super().transfer_batch_to_device(batch, device, dataloader_idx)  # type: ignore[misc]
