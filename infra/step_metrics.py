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
- automatic optimisation builds a closure and runs the step through several wrappers around
  it (about 0.4 ms a step); a :class:`LeanSteps` module optimises manually instead, in the same
  order (forward, zero_grad, backward, the ``on_before_optimizer_step`` hooks, gradient clipping,
  the optimiser step), so it trains to the same weights; precision plugins (loss scaling, unscaling
  before clipping) and multi-process gradient sync work as in automatic optimisation.
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
    """Mixin for a ``LightningModule`` (list it first): training steps without Lightning's per-step extras.

    - ``training_step`` computes the loss and ends with ``return self.optimize(loss)``: the
      module optimises manually (one optimiser, rates set by the module or a callback rather
      than a Lightning scheduler). Gradient clipping by norm comes from
      :meth:`clip_gradients_at` (the train task passes ``TrainSpec.gradient_clip_val``) and is
      applied after the ``on_before_optimizer_step`` hooks, where automatic optimisation applies it.
    - in ``training_step`` call :meth:`log_epoch_mean` instead of
      ``self.log(name, value, on_step=False, on_epoch=True, batch_size=n)``: the value is
      accumulated as a tensor and logged once per epoch as the same mean. Validation and test
      steps keep ``self.log`` (they are not on the training clock, and callbacks that monitor
      them read the metrics at their epoch's end).

    A subclass that overrides ``on_train_batch_end``, ``on_train_epoch_start``,
    ``on_train_epoch_end`` or ``on_before_optimizer_step`` calls ``super()`` there.
    """

    _epoch_means: EpochMeans | None = None
    _clip_norm: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_current_fx_name":
            # Lightning sets this around every hook call (dozens of times a step); it is never a
            # parameter, buffer or sub-module, so torch.nn.Module's checks for those are skipped
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    def clip_gradients_at(self, max_norm: float | None) -> None:
        """Clip the gradients' total norm to ``max_norm`` before each optimiser step (None: no clipping)."""
        if max_norm is not None and max_norm <= 0:
            raise ValueError(f"gradient clipping needs a positive norm, got {max_norm}")
        self._clip_norm = max_norm

    def optimize(self, loss: torch.Tensor) -> torch.Tensor:
        """One optimiser step on ``loss``, as automatic optimisation would take it; returns the loss.

        Outside a trainer (a step called by hand) nothing is optimised.
        """
        if getattr(self, "_trainer", None) is None or self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        if isinstance(optimizer, list):
            raise TypeError(f"{type(self).__name__}: LeanSteps steps one optimiser, configure_optimizers gave "
                             f"{len(optimizer)}")
        if self.lr_schedulers() is not None:
            raise ValueError(f"{type(self).__name__}: LeanSteps does not step Lightning learning-rate schedulers; "
                             "set the rates in a hook (see SensorRULModel.on_train_batch_start)")
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        super().on_before_optimizer_step(optimizer)  # type: ignore[misc]
        if self._clip_norm is not None and not self.automatic_optimization:
            # after the callbacks' hooks (they see the gradients before clipping) and, with mixed
            # precision, after the unscaling: where automatic optimisation clips
            self.clip_gradients(optimizer, gradient_clip_val=self._clip_norm, gradient_clip_algorithm="norm")

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
