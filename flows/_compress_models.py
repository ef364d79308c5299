"""Model-type adapters of the compress flow: how to rebuild, evaluate and shrink one type.

The compress flow is generic; everything it needs to know about a model type comes from a
:class:`ModelAdapter` registered under the ``architecture`` its registry params carry.
A new type plugs in by adding an adapter with :func:`register_adapter`:

- ``build(params, state)``: an fp32 module with one output tensor from registry params +
  plain tensors (it must accept structurally pruned states, see
  :func:`tasks.compress.resize_to_state`);
- ``prepare(ref, options)``: a :class:`CompressTarget` with the held-out test batches, the
  labels, the primary metric, a data module for fine-tuning, a student factory and, for
  models that do not train themselves, the losses.

Adapters: the fraud sequence model (``FraudSequenceModel``) and the sensor 1D-CNN with its
RUL and failure heads (``SensorRULModel``, seen through :class:`SensorOutputs`).
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

import tasks.compress as C
from infra.registry import ModelRef, ModelRegistry
from solutions.fraud.config import SequenceModelConfig, SplitConfig, SyntheticDataConfig
from solutions.sensor.config import SyntheticFleetConfig
from tasks.compress import ChannelGroup

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
    # models that do not train themselves (plain modules, several heads, regression):
    # loss_fn(outputs, batch) for fine-tuning and the distiller's hard loss, and
    # soft_loss(student_out, teacher_out, T); None: the model is a LightningModule and
    # distillation uses binary BCE with pos_weight on label_key
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor] | None = None
    soft_loss: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None
    lr: float = 1e-3  # fine-tuning / distillation learning rate with loss_fn
    prune_plan: list[ChannelGroup] | None = None  # structured pruning steps; None: the MLP blocks
    prune_note: str = "of MLP neurons removed"
    bench_inputs: Any = None  # held-out inputs for latency and an extra ONNX check; None: test_batches[0]
    output_columns: list[str] = field(default_factory=list)  # names of the output's columns, if 2-D
    notes: dict[str, str] = field(default_factory=dict)  # extra table note per candidate name
    # other metrics of a module, shown beside the primary one (never used to choose)
    secondary: Callable[[nn.Module], dict[str, float]] | None = None

    def score(self, module: nn.Module) -> float:
        """The primary metric of ``module`` on the held-out batches."""
        from tasks.compress import predict

        return float(self.metric(self.labels, predict(module, self.test_batches)))


@dataclass(frozen=True)
class ModelAdapter:
    """How the compress flow handles one model type."""

    architecture: str
    build: Callable[[Mapping[str, Any]], nn.Module]  # fresh fp32 module from params
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


def _fraud_build(params: Mapping[str, Any]) -> nn.Module:
    from solutions.fraud.model import build_module

    return build_module(dict(params))


def _fraud_prepare(ref: ModelRef, options: Mapping[str, Any]) -> CompressTarget:
    from sklearn.metrics import average_precision_score

    import flows.fraud as F
    from solutions.fraud import pipeline as P
    from solutions.fraud.model import FraudSequenceModel
    from solutions.fraud.sequences import FraudPreprocessor

    opts = FraudEvalData.model_validate(dict(options))
    registry = ModelRegistry()
    model = C.load_variant(ref, registry, _fraud_build)
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


# ------------------------------------------------------------------------------------
# sensor 1D-CNN with RUL and failure heads


class SensorEvalData(BaseModel):
    """Where the sensor adapter gets its held-out data (the seeded synthetic fleet by default)."""

    model_config = ConfigDict(frozen=True)

    data: str | None = Field(default=None, description="Long-format readings file; default: the synthetic fleet.")
    events: str | None = Field(default=None, description="Failure events file.")
    columns: dict[str, str] = Field(default_factory=dict)
    cmapss_dir: str | None = Field(default=None, description="C-MAPSS folder instead of --data.")
    subset: str = "FD001"
    fleet: SyntheticFleetConfig = SyntheticFleetConfig()


#: Structured pruning of the sensor model: conv channels (with their BatchNorm), the
#: embedding and the shared hidden layer. The last conv feeds ``proj`` twice (mean and max
#: pooling side by side).
SENSOR_PRUNE_PLAN = [
    ChannelGroup(producer="encoder.convs.0.0", norm="encoder.convs.0.1", consumers=("encoder.convs.1.0",)),
    ChannelGroup(producer="encoder.convs.1.0", norm="encoder.convs.1.1", consumers=("encoder.convs.2.0",)),
    ChannelGroup(producer="encoder.convs.2.0", norm="encoder.convs.2.1", consumers=("encoder.proj.1",), repeats=2),
    ChannelGroup(producer="encoder.proj.1", consumers=("heads.shared.0",)),
    ChannelGroup(producer="heads.shared.0", consumers=("heads.rul", "heads.fail")),
]


def _sensor_build(params: Mapping[str, Any]) -> nn.Module:
    from solutions.sensor.model import build_module

    return build_module(dict(params))


def sensor_rmse(y: np.ndarray, out: np.ndarray, rul_cap: float) -> float:
    """Test RMSE as ``sensor-train`` computes it: RUL head clamped to [0, 1] x cap, in float32."""
    pred = (np.clip(out[:, 0].astype("float32"), 0, 1) * np.float32(rul_cap)).astype("float64")
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def _sensor_prepare(ref: ModelRef, options: Mapping[str, Any]) -> CompressTarget:
    import torch.nn.functional as F

    import flows.sensor as FS
    from solutions.sensor import pipeline as P
    from solutions.sensor.config import FinetuneConfig, SensorConfig, WindowConfig
    from solutions.sensor.config import SplitConfig as SensorSplit
    from solutions.sensor.features import RegimeNormalizer
    from solutions.sensor.model import SensorOutputs, SensorRULModel, WindowDataModule, rul_fail_loss

    if ref.primary_metric != FS.PRIMARY_METRIC or ref.higher_is_better:
        raise ValueError(
            f"{ref.spec} has primary metric {ref.primary_metric!r} (higher is better: {ref.higher_is_better}); "
            f"the sensor adapter scores {FS.PRIMARY_METRIC!r}, lower is better"
        )
    opts = SensorEvalData.model_validate(dict(options))
    registry = ModelRegistry()
    model = C.load_variant(ref, registry, _sensor_build)
    hp = dict(ref.params["hparams"])
    cap, fail_weight, pos_weight = float(hp["rul_cap"]), float(hp["fail_weight"]), float(hp["pos_weight"])
    norm = RegimeNormalizer.from_dict(ref.params["normalizer"])
    wcfg = WindowConfig(**ref.params["window"])
    split = SensorSplit(**ref.params.get("split", {}))
    ft = FinetuneConfig()  # sensor-train's batch size, epoch size and seed (not in the params)
    source = FS.SensorSource(data=opts.data, events=opts.events, columns=dict(opts.columns),
                             cmapss_dir=opts.cmapss_dir, subset=opts.subset)
    grid_ref, bad = FS.obtain_grid(source, SensorConfig(fleet=opts.fleet, window=wcfg, split=split))
    grid = grid_ref.read()
    # the same splits, labelled assets and test cuts as sensor-train
    splits = P.split_assets(grid, split)
    labelled = P.labelled_assets(grid, splits["train"], float(ref.params.get("label_fraction", 1.0)), ft.seed)
    data = P.supervised_windows(grid, splits, labelled, norm, wcfg, bad, split.seed)
    x_test = torch.as_tensor(data.test_last.x, dtype=torch.float32)
    note = f"the last window of each of {len(data.test_last)} cut test units of {source.describe()} (the sensor-train protocol)"
    if ref.data_hash and ref.data_hash != grid_ref.content_hash:
        note += f"; WARNING: data hash {grid_ref.content_hash[:12]} differs from the training data {ref.data_hash[:12]}"
        log.warning("evaluating %s on data other than its training data (%s)", ref.spec, note)
    dm = WindowDataModule(
        (data.train.x, data.train.rul, data.train.fail), (data.val.x, data.val.rul, data.val.fail),
        ft.batch_size, ft.min_samples_per_epoch, ft.seed,
    )

    def metric(y: np.ndarray, out: np.ndarray) -> float:
        return sensor_rmse(y, out, cap)

    def loss_fn(out: torch.Tensor, batch: Any) -> torch.Tensor:
        _, rul, fail = batch
        return rul_fail_loss(out[:, 0], out[:, 1], rul, fail, rul_cap=cap, fail_weight=fail_weight, pos_weight=pos_weight)

    def soft_loss(s: torch.Tensor, t: torch.Tensor, T: float) -> torch.Tensor:
        # regression head: match the teacher's output; failure head: softened logits, scaled by T^2
        fail = F.binary_cross_entropy_with_logits(s[:, 1] / T, torch.sigmoid(t[:, 1] / T)) * T * T
        return F.mse_loss(s[:, 0], t[:, 0]) + fail_weight * fail

    x_all = torch.as_tensor(data.test_all.x, dtype=torch.float32)
    fail_all = data.test_all.fail.astype(int)

    def failure_head(module: nn.Module) -> dict[str, float]:
        """The failure head's test PR-AUC on every window of the failed test assets (as sensor-train)."""
        from sklearn.metrics import average_precision_score

        from tasks.compress import predict

        if not 0 < fail_all.sum() < len(fail_all):
            return {}
        prob = torch.sigmoid(torch.as_tensor(predict(module, torch.split(x_all, 1024))[:, 1])).numpy()
        return {"test/pr_auc": float(average_precision_score(fail_all, prob.astype("float64")))}

    def make_student() -> tuple[nn.Module, dict[str, Any]]:
        small = dict(hp)
        small.update(channels=max(8, int(hp["channels"]) // 2), embedding_dim=max(8, int(hp["embedding_dim"]) // 4))
        return SensorOutputs(SensorRULModel(**small)), {**ref.params, "hparams": small}

    return CompressTarget(
        model=model,
        test_batches=list(torch.split(x_test, 1024)),
        labels=data.test_last.rul.astype("float64"),
        metric=metric,
        primary_metric=ref.primary_metric,
        higher_is_better=ref.higher_is_better,
        input_names=["x"],
        datamodule=dm,
        make_student=make_student,
        pos_weight=pos_weight,
        data_hash=grid_ref.content_hash,
        data_note=note,
        loss_fn=loss_fn,
        soft_loss=soft_loss,
        lr=float(hp.get("lr", 1e-3)),
        prune_plan=SENSOR_PRUNE_PLAN,
        prune_note="of the Conv1d channels (with their BatchNorm) and of the embedding and hidden neurons removed",
        bench_inputs=x_all,
        output_columns=["rul/cap", "fail_logit"],
        notes={
            "int8-dynamic": "Linear layers only: the 3 Conv1d layers stay fp32 (dynamic quantization has no conv kernels)",
            "int8-weight-only": "Conv1d and Linear weights",
        },
        secondary=failure_head,
    )


register_adapter(ModelAdapter("SensorRULModel", _sensor_build, _sensor_prepare))
