"""Model-type adapters of the compress flow: how to rebuild, evaluate and shrink one type.

The compress flow is generic; everything it needs to know about a model type comes from a
:class:`ModelAdapter` registered under the ``architecture`` its registry params carry.
A new type (e.g. the sensor CNN) plugs in by adding an adapter with :func:`register_adapter`:

- ``build(params, state)``: an fp32 module from registry params + plain tensors (it must
  accept structurally pruned states, see :func:`tasks.compress.resize_linears_to`);
- ``prepare(ref, options)``: a :class:`CompressTarget` with the held-out test batches, the
  labels, the primary metric, a data module for fine-tuning and a student factory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from infra.registry import ModelRef, ModelRegistry
from solutions.fraud.config import SequenceModelConfig, SplitConfig, SyntheticDataConfig
from tasks.compress import resize_linears_to

log = logging.getLogger(__name__)


@dataclass
class CompressTarget:
    """A registered model ready to compress: the module, its test data and how to score it."""

    model: nn.Module  # fp32, eval mode, CPU
    test_batches: list[Any]  # held-out inputs in a fixed order; every candidate sees the same
    labels: np.ndarray
    metric: Callable[[np.ndarray, np.ndarray], float]  # (labels, raw outputs) -> primary metric
    primary_metric: str
    higher_is_better: bool
    input_names: list[str]  # the inputs the model reads (ONNX inputs)
    datamodule: Any  # train/val loaders for fine-tuning and distillation
    make_student: Callable[[], tuple[nn.Module, dict[str, Any]]] | None  # (student, its params)
    label_key: str = "y"
    pos_weight: float = 1.0
    data_hash: str | None = None
    data_note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def score(self, module: nn.Module) -> float:
        """The primary metric of ``module`` on the held-out batches."""
        from tasks.compress import predict

        return float(self.metric(self.labels, predict(module, self.test_batches)))


@dataclass(frozen=True)
class ModelAdapter:
    """How the compress flow handles one model type."""

    architecture: str
    build: Callable[[Mapping[str, Any], Mapping[str, torch.Tensor]], nn.Module]
    prepare: Callable[[ModelRef, Mapping[str, Any]], CompressTarget]


ADAPTERS: dict[str, ModelAdapter] = {}


def register_adapter(adapter: ModelAdapter) -> ModelAdapter:
    ADAPTERS[adapter.architecture] = adapter
    return adapter


def adapter_for(ref: ModelRef) -> ModelAdapter:
    """The adapter of a registered model, from its params' ``architecture``."""
    arch = ref.params.get("architecture")
    if arch not in ADAPTERS:
        raise ValueError(
            f"{ref.spec} has architecture {arch!r}; the compress flow knows {sorted(ADAPTERS)} "
            "(add a ModelAdapter in flows/_compress_models.py)"
        )
    return ADAPTERS[arch]


# ------------------------------------------------------------------------------------
# fraud sequence model


class FraudEvalData(BaseModel):
    """Where the fraud adapter gets its held-out data (the training data by default)."""

    model_config = ConfigDict(frozen=True)

    data: str | None = Field(default=None, description="Transactions file; default: the seeded synthetic data.")
    columns: dict[str, str] = Field(default_factory=dict)
    accounts: str | None = None
    synthetic: SyntheticDataConfig = SyntheticDataConfig()


def _fraud_build(params: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> nn.Module:
    from solutions.fraud.model import FraudSequenceModel

    if params.get("architecture") != "FraudSequenceModel":
        raise ValueError(f"not a fraud sequence model: {params.get('architecture')!r}")
    model = FraudSequenceModel(**params["hparams"])
    resize_linears_to(model, state)
    model.load_state_dict(dict(state))
    return model.eval()


def _fraud_prepare(ref: ModelRef, options: Mapping[str, Any]) -> CompressTarget:
    from sklearn.metrics import average_precision_score

    import flows.fraud as F
    from solutions.fraud import pipeline as P
    from solutions.fraud.model import FraudSequenceModel
    from solutions.fraud.sequences import FraudPreprocessor

    opts = FraudEvalData.model_validate(dict(options))
    registry = ModelRegistry()
    model = _fraud_build(ref.params, registry.load_state_dict(ref))
    pre = FraudPreprocessor.from_dict(ref.params["preprocessor"])
    cfg = SequenceModelConfig(**ref.params["config"])
    split = SplitConfig(**ref.params.get("split", {}))
    data_ref = F.obtain_transactions(opts.data, dict(opts.columns), opts.synthetic, opts.accounts)
    feats_ref, split_text = F.prepare_features(data_ref, split, 7.0)
    df, feats = data_ref.read(), feats_ref.read()
    setup = P.sequence_setup(df, feats, cfg, preprocessor=pre)
    batches = [{k: v for k, v in b.items()} for b in setup.datamodule.test_dataloader()]
    labels = torch.cat([b["y"] for b in batches]).numpy().astype("int64")
    note = f"test period of {split_text}"
    if ref.data_hash and ref.data_hash != data_ref.content_hash:
        note += f"; WARNING: data hash {data_ref.content_hash[:12]} differs from the training data {ref.data_hash[:12]}"
        log.warning("evaluating %s on data other than its training data (%s)", ref.spec, note)
    train_y = F._period_labels(df, feats, "train").astype("float64")

    def make_student() -> tuple[nn.Module, dict[str, Any]]:
        hp = dict(ref.params["hparams"])
        hp.update(hidden=max(8, int(hp.get("hidden", 64)) // 2), mlp_hidden=max(8, int(hp.get("mlp_hidden", 128)) // 4))
        student = FraudSequenceModel(**hp)
        params = {**ref.params, "hparams": hp}
        return student, params

    def metric(y: np.ndarray, out: np.ndarray) -> float:
        return float(average_precision_score(y, out))

    return CompressTarget(
        model=model,
        test_batches=batches,
        labels=labels,
        metric=metric,
        primary_metric=ref.primary_metric,
        higher_is_better=ref.higher_is_better,
        input_names=["step_num", "step_cat", "ctx_num", "ctx_cat"],
        datamodule=setup.datamodule,
        make_student=make_student,
        pos_weight=P.pos_weight_for(train_y),
        data_hash=data_ref.content_hash,
        data_note=note,
    )


register_adapter(ModelAdapter("FraudSequenceModel", _fraud_build, _fraud_prepare))
