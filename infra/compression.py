"""The contracts between a solution's compression adapter and the generic compress flow.

A solution (``solutions/<vertical>/compress.py``) describes one model type with a
:class:`ModelAdapter`; the compress flow (``flows/compress``) receives it, loads the
registered model with the adapter's ``build`` and asks ``prepare`` for a
:class:`CompressTarget`: the held-out data, how to score, how to train further. The
generic machinery (``tasks/compress.py``) works on these objects and plain modules.

Only data types live here, plus :func:`table_fingerprint` (the recipe of a target's
``data_hash``); no torch surgery, no Prefect. ``solutions`` and ``tasks`` may both import
``infra``, never each other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from infra.registry import ModelRef


class ChannelGroup(BaseModel):
    """One structured-pruning step: the output channels (or neurons) of ``producer``.

    ``norm`` (a BatchNorm1d right after the producer) loses the same channels; each
    consumer (Linear or Conv1d) loses the matching input columns. ``repeats``: the
    consumers' input is that many copies of the channels concatenated (e.g. mean and
    max pooling side by side: 2). ``passthrough``: inputs of the consumers after those
    copies that come from elsewhere (e.g. statistics of the model's input); they are kept.
    """

    model_config = ConfigDict(frozen=True)

    producer: str = Field(description="Module whose output channels are removed.")
    consumers: tuple[str, ...] = Field(description="Modules reading the producer's output.")
    norm: str | None = Field(default=None, description="BatchNorm1d right after the producer, if any.")
    repeats: int = Field(default=1, ge=1, description="Copies of the channels in the consumers' input.")
    passthrough: int = Field(default=0, ge=0, description="Consumer inputs after the copies, from elsewhere, kept whole.")


@dataclass
class CompressTarget:
    """A registered model ready to compress: the module, its held-out data and how to score it.

    Attributes:
        model: the fp32 module, eval mode, on CPU, with one output tensor.
        test_batches: held-out inputs in a fixed order; every candidate sees the same.
        labels: the held-out labels, aligned with the concatenated outputs.
        metric: ``(labels, raw outputs) -> primary metric``.
        primary_metric: the registry's metric name (``test/auprc``).
        higher_is_better: the metric's direction.
        input_names: the inputs the model reads (ONNX input names).
        datamodule: train/val loaders for fine-tuning and distillation.
        make_student: a smaller fresh module and its registry params, or None.
        label_key: where dict batches keep their labels.
        pos_weight: positive-class weight of the default (binary) distillation loss.
        data_hash: a fingerprint of the held-out data.
        data_note: one line saying what the held-out data is.
        loss_fn: ``loss_fn(outputs, batch)`` for models that do not train themselves
            (plain modules, several heads, regression); fine-tuning and the distiller's
            hard loss use it. None: the model is a LightningModule, distillation uses BCE.
        soft_loss: ``soft_loss(student_out, teacher_out, T)``, given with ``loss_fn``.
        lr: fine-tuning / distillation learning rate with ``loss_fn``.
        prune_plan: structured pruning steps; None: the MLP blocks.
        prune_note: how the table describes structured pruning.
        bench_inputs: held-out inputs for latency and an extra ONNX check; None: the first test batch.
        output_columns: names of the output's columns, if it is 2-D.
        notes: an extra table note per candidate name.
        secondary: other metrics of a module, shown beside the primary one (never used to choose).
    """

    model: nn.Module
    test_batches: list[Any]
    labels: np.ndarray
    metric: Callable[[np.ndarray, np.ndarray], float]
    primary_metric: str
    higher_is_better: bool
    input_names: list[str]
    datamodule: Any
    make_student: Callable[[], tuple[nn.Module, dict[str, Any]]] | None
    label_key: str = "y"
    pos_weight: float = 1.0
    data_hash: str | None = None
    data_note: str = ""
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor] | None = None
    soft_loss: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None
    lr: float = 1e-3
    prune_plan: list[ChannelGroup] | None = None
    prune_note: str = "of MLP neurons removed"
    bench_inputs: Any = None
    output_columns: list[str] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    secondary: Callable[[nn.Module], dict[str, float]] | None = None


@dataclass(frozen=True)
class ModelAdapter:
    """How the compress flow handles one model type (the ``architecture`` of its registry params).

    Attributes:
        architecture: the registry params' ``architecture`` this adapter handles.
        build: a fresh fp32 module with one output tensor from the registry params.
        prepare: ``(ref, model, options) -> CompressTarget``: the held-out data of the
            registered ``ref`` (``model`` is its loaded module) read as ``options`` say.
        options: the pydantic model of ``prepare``'s data options.
        check: what the options alone can tell before a run (files exist, mapping names
            valid); raises :class:`~infra.errors.DataValidationError` naming the fix.
    """

    architecture: str
    build: Callable[[Mapping[str, Any]], nn.Module]
    prepare: Callable[[ModelRef, nn.Module, Any], CompressTarget]
    options: type[BaseModel]
    check: Callable[[Any], None]


def table_fingerprint(df: pd.DataFrame) -> str:
    """A content hash of a held-out table (values and column names): a target's ``data_hash``."""
    digest = hashlib.sha256(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    digest.update("|".join(map(str, df.columns)).encode())
    return digest.hexdigest()
