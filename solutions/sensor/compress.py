"""The sensor 1D-CNN's compression adapter: rebuild, held-out data, metric, losses, prune plan.

Plain torch / numpy / pandas (no Prefect): the compress flow receives :data:`ADAPTER`.
The model is seen through :class:`~solutions.sensor.inference.SensorOutputs` (one output
tensor: RUL / cap and the failure logit). The held-out data follows the ``sensor-train``
protocol on the same splits: the last window of each cut test unit, scored by test RMSE
(lower is better); the failure head's PR-AUC is shown beside it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score
from torch import nn

from infra.compression import ChannelGroup, CompressTarget, ModelAdapter, table_fingerprint
from infra.errors import DataValidationError
from infra.registry import ModelRef
from solutions.sensor import pipeline as P
from solutions.sensor.cmapss import check_subset
from solutions.sensor.config import (
    AlignConfig,
    FinetuneConfig,
    SensorConfig,
    SensorHeldOut,
    SensorSource,
    SplitConfig,
    WindowConfig,
)
from solutions.sensor.data import build_grid
from solutions.sensor.encoder import N_WINDOW_STATS
from solutions.sensor.features import RegimeNormalizer
from solutions.sensor.inference import SensorOutputs, build_module
from solutions.sensor.model import SensorRULEnsemble, SensorRULModel, WindowDataModule, rul_fail_loss
from solutions.sensor.schema import BadReadingReport, ColumnMapping

log = logging.getLogger(__name__)

#: the registry architecture of a seed ensemble of CNNs
ENSEMBLE = SensorRULEnsemble.__name__

#: The metric this adapter scores (``sensor-train`` registers it; lower is better).
PRIMARY_METRIC = "test/rmse"

def prune_plan(pooling: str = "meanmax", norm: str = "batch", stat_inputs: int = 0, members: int | None = None,
               arch: str = "cnn") -> list[ChannelGroup]:
    """Structured pruning of the sensor model: conv channels (with their BatchNorm, when the
    encoder has one: ``norm``), the embedding and the shared hidden layer. The last conv feeds
    ``proj`` twice when two poolings sit side by side (``meanmax``, ``meanlast``), once for ``mean``;
    ``stat_inputs``: the window statistics ``proj`` reads after them (kept whole). ``members``:
    the plan of a seed ensemble of that many CNNs (each member pruned alike), None for one CNN.
    ``arch``: a ``tcn`` or ``transformer`` trunk keeps its channels (residual sums tie them);
    only the embedding and the shared hidden layer are pruned."""
    if members is not None:
        return [g.model_copy(update={"producer": f"members.{i}.{g.producer}",
                                     "norm": f"members.{i}.{g.norm}" if g.norm else None,
                                     "consumers": tuple(f"members.{i}.{c}" for c in g.consumers)})
                for i in range(members) for g in prune_plan(pooling, norm, stat_inputs, arch=arch)]

    def bn(i: int) -> str | None:
        return f"encoder.convs.{i}.1" if norm == "batch" else None

    dense = [
        ChannelGroup(producer="encoder.proj.1", consumers=("heads.shared.0",)),
        ChannelGroup(producer="heads.shared.0", consumers=("heads.rul", "heads.fail")),
    ]
    if arch != "cnn":
        return dense
    return [
        ChannelGroup(producer="encoder.convs.0.0", norm=bn(0), consumers=("encoder.convs.1.0",)),
        ChannelGroup(producer="encoder.convs.1.0", norm=bn(1), consumers=("encoder.convs.2.0",)),
        ChannelGroup(producer="encoder.convs.2.0", norm=bn(2), consumers=("encoder.proj.1",),
                     repeats=1 if pooling == "mean" else 2, passthrough=stat_inputs),
        *dense,
    ]


def member_hparams(params: dict[str, Any]) -> dict[str, Any]:
    """The hyper-parameters of one CNN of a registered sensor model (a seed ensemble's members share them)."""
    hp = params["hparams"]
    return dict(hp["member"]) if params.get("architecture") == ENSEMBLE else dict(hp)


#: the plan of a model with mean and max pooling (the model class's default)
PRUNE_PLAN = prune_plan("meanmax")


# ------------------------------------------------------------------------------------
# held-out data


def check_options(options: SensorHeldOut) -> None:
    """The files exist, the subset and the column mapping are valid (before any data is read)."""
    try:
        ColumnMapping(options.columns)
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    if options.cmapss_dir:
        check_subset(options.subset)
        if not Path(options.cmapss_dir).expanduser().is_dir():
            raise DataValidationError("C-MAPSS folder not found (or not a folder)", source=options.cmapss_dir)
    for path, what in ((options.data, "readings file"), (options.events, "events file")):
        if path is not None and not Path(path).expanduser().is_file():
            raise DataValidationError(f"{what} not found (or not a file)", source=path)


def load_grid(options: SensorHeldOut, align: AlignConfig) -> tuple[pd.DataFrame, BadReadingReport, str]:
    """The aligned grid of the source, the bad readings its reader counted, and what the source is."""
    check_options(options)
    source = SensorSource(data=options.data, events=options.events, columns=options.columns,
                          cmapss_dir=options.cmapss_dir, subset=options.subset)
    grid, report = build_grid(source, SensorConfig(fleet=options.fleet, align=align))
    if options.cmapss_dir:
        described = f"C-MAPSS {check_subset(options.subset)} in {Path(options.cmapss_dir).expanduser()}"
    else:
        described = options.data or f"synthetic fleet (seed {options.fleet.seed})"
    return grid, report, described


def sensor_rmse(y: np.ndarray, out: np.ndarray, rul_cap: float) -> float:
    """Test RMSE as ``sensor-train`` computes it: RUL head clamped to [0, 1] x cap, in float32."""
    pred = (np.clip(out[:, 0].astype("float32"), 0, 1) * np.float32(rul_cap)).astype("float64")
    return float(np.sqrt(np.mean((pred - y) ** 2)))


# ------------------------------------------------------------------------------------
# losses, student, failure head


def losses(hp: dict[str, Any]) -> tuple[Any, Any]:
    """``(loss_fn(out, batch), soft_loss(student_out, teacher_out, T))`` of the two-head output."""
    cap, fail_weight, pos_weight = float(hp["rul_cap"]), float(hp["fail_weight"]), float(hp["pos_weight"])

    def loss_fn(out: torch.Tensor, batch: Any) -> torch.Tensor:
        _, rul, fail = batch
        return rul_fail_loss(out[:, 0], out[:, 1], rul, fail, rul_cap=cap, fail_weight=fail_weight, pos_weight=pos_weight)

    def soft_loss(s: torch.Tensor, t: torch.Tensor, T: float) -> torch.Tensor:
        # regression head: match the teacher's output; failure head: softened logits, scaled by T^2
        fail = F.binary_cross_entropy_with_logits(s[:, 1] / T, torch.sigmoid(t[:, 1] / T)) * T * T
        return F.mse_loss(s[:, 0], t[:, 0]) + fail_weight * fail

    return loss_fn, soft_loss


def student_of(params: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """A fresh, smaller model (half the channels, a quarter of the embedding) and its registry
    params; a seed ensemble's student is one such CNN."""
    small = member_hparams(params)
    small.update(channels=max(8, int(small["channels"]) // 2), embedding_dim=max(8, int(small["embedding_dim"]) // 4))
    return SensorOutputs(SensorRULModel(**small)), {**params, "architecture": SensorRULModel.__name__, "hparams": small}


def failure_pr_auc(x: torch.Tensor, fail: np.ndarray) -> Any:
    """``module -> {"test/pr_auc": ...}``: the failure head's PR-AUC on windows ``x`` (as sensor-train)."""

    def secondary(module: nn.Module) -> dict[str, float]:
        if not 0 < fail.sum() < len(fail):
            return {}
        module.eval()
        with torch.inference_mode():
            logits = torch.cat([module(b)[:, 1].float() for b in torch.split(x, 1024)])
        return {"test/pr_auc": float(average_precision_score(fail, torch.sigmoid(logits).numpy().astype("float64")))}

    return secondary


# ------------------------------------------------------------------------------------
# the adapter


def prepare(ref: ModelRef, model: nn.Module, options: SensorHeldOut) -> CompressTarget:
    """The compress target of a registered sensor model: the sensor-train test protocol, scored by RMSE."""
    if ref.primary_metric != PRIMARY_METRIC or ref.higher_is_better:
        raise DataValidationError(
            f"{ref.spec} has primary metric {ref.primary_metric!r} (higher is better: {ref.higher_is_better}); "
            f"the sensor adapter scores {PRIMARY_METRIC!r}, lower is better"
        )
    hp = member_hparams(ref.params)
    members = int(ref.params["hparams"]["members"]) if ref.params.get("architecture") == ENSEMBLE else None
    norm = RegimeNormalizer.from_dict(ref.params["normalizer"])
    wcfg = WindowConfig(**ref.params["window"])
    split = SplitConfig(**ref.params.get("split", {}))
    ft = FinetuneConfig()  # sensor-train's batch size, epoch size and seed (not in the params)
    grid, bad, source = load_grid(options, AlignConfig())
    # the same splits, labelled assets and test cuts as sensor-train
    splits = P.split_assets(grid, split)
    labelled = P.labelled_assets(grid, splits["train"], float(ref.params.get("label_fraction", 1.0)), ft.seed)
    data = P.supervised_windows(grid, splits, labelled, norm, wcfg, bad, split.seed)
    dm = WindowDataModule(
        (data.train.x, data.train.rul, data.train.fail), (data.rul_val.x, data.rul_val.rul, data.rul_val.fail),
        ft.batch_size, ft.min_samples_per_epoch, ft.seed,
    )
    loss_fn, soft_loss = losses(hp)
    x_all = torch.as_tensor(data.test_all.x, dtype=torch.float32)
    cap = float(hp["rul_cap"])
    return CompressTarget(
        model=model,
        test_batches=list(torch.split(torch.as_tensor(data.test_last.x, dtype=torch.float32), 1024)),
        labels=data.test_last.rul.astype("float64"),
        metric=lambda y, out: sensor_rmse(y, out, cap),
        primary_metric=ref.primary_metric,
        higher_is_better=ref.higher_is_better,
        input_names=["x"],
        datamodule=dm,
        make_student=lambda: student_of(ref.params),
        pos_weight=float(hp["pos_weight"]),
        data_hash=table_fingerprint(grid),
        data_note=f"the last window of each of {len(data.test_last)} cut test units of {source} (the sensor-train protocol)",
        loss_fn=loss_fn,
        soft_loss=soft_loss,
        lr=float(hp.get("lr", 1e-3)),
        prune_plan=prune_plan(hp.get("pooling", "meanmax"), hp.get("norm", "batch"),
                              N_WINDOW_STATS * int(hp["n_channels"]) if hp.get("stats") else 0, members,
                              arch=hp.get("arch", "cnn")),
        prune_note=("of the Conv1d channels (with their BatchNorm) and of the embedding and hidden neurons removed"
                    if hp.get("arch", "cnn") == "cnn" else "of the embedding and hidden neurons removed (the "
                    f"{hp['arch']} trunk kept whole)"),
        bench_inputs=x_all,
        output_columns=["rul/cap", "fail_logit"],
        notes={
            "int8-dynamic": ("Linear layers only: the 3 Conv1d layers stay fp32 (dynamic quantization has no conv kernels)"
                             if hp.get("arch", "cnn") == "cnn" else
                             f"Linear layers only: the {hp['arch']} trunk's Conv1d layers stay fp32 (dynamic quantization "
                             "has no conv kernels)"),
            "int8-weight-only": "Conv1d and Linear weights",
        },
        secondary=failure_pr_auc(x_all, data.test_all.fail.astype(int)),
    )


ADAPTER = ModelAdapter(architecture=SensorRULModel.__name__, build=build_module, prepare=prepare, options=SensorHeldOut,
                       check=check_options)
#: a seed ensemble of CNNs: pruned member by member; its distilled student is one small CNN
ENSEMBLE_ADAPTER = ModelAdapter(architecture=ENSEMBLE, build=build_module, prepare=prepare, options=SensorHeldOut,
                                check=check_options)
