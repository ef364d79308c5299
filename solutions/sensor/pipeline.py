"""Sensor pipeline steps as plain functions: splits, labels, windows, evaluation, params.

No Prefect here: ``flows/sensor/steps.py`` wraps these steps in tasks and the flows join
them with the generic train / fine-tune / evaluate / register tasks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from infra.determinism import seeded
from infra.registry import ModelRef, ModelRegistry
from infra.store import stable_hash
from solutions.sensor import schema as S
from solutions.sensor.config import (
    DEFAULT_STRIDE,
    FinetuneConfig,
    ModelConfig,
    PretrainConfig,
    SensorConfig,
    SplitConfig,
    WindowConfig,
)
from solutions.sensor.features import RegimeNormalizer, WindowSet, make_windows
from solutions.sensor.metrics import alert_lead_times, phm08_score
from solutions.sensor.model import (
    MaskedReconstruction,
    RULModel,
    SensorRULModel,
    WindowDataModule,
    rul_model_from_params,
)
from solutions.sensor.schema import BadReadingReport

log = logging.getLogger(__name__)

#: What the champion rule compares for the RUL/failure model (lower is better).
PRIMARY_METRIC = "test/rmse"
#: What the champion rule compares for the pre-trained encoder (lower is better).
ENCODER_METRIC = "val/masked_mse"
#: Parameter groups of progressive fine-tuning, unfrozen from the top.
PROGRESSIVE_GROUPS = ("heads", "encoder.proj", "encoder.convs")
#: Held-out assets are cut leaving at least this many steps (or the window length, if shorter),
#: whatever the window: the test cuts are the data's, not the model's (C-MAPSS FD001's
#: shortest test engine has 31 cycles); a longer window left-pads the short ones.
TEST_MIN_STEPS = 30


def _split_parts(grid: pd.DataFrame, cfg: SplitConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """The test assets, the others in their drawn order, and the validation block size."""
    first = grid.drop_duplicates(S.ASSET)
    assets = first[S.ASSET].to_numpy().astype(str)
    rng = np.random.default_rng(cfg.seed)
    if (first[S.SET] == "test").any():
        test = assets[(first[S.SET] == "test").to_numpy()]
        rest = rng.permutation(assets[(first[S.SET] != "test").to_numpy()])
        return test, rest, max(1, round(cfg.val_fraction * len(rest)))
    perm = rng.permutation(assets)
    n_test = max(1, round(cfg.test_fraction * len(perm)))
    return perm[:n_test], perm[n_test:], max(1, round(cfg.val_fraction * len(perm)))


def validation_blocks(grid: pd.DataFrame, cfg: SplitConfig, wanted: int) -> int:
    """How many disjoint validation blocks (of the configured size) the non-test assets give, at
    most ``wanted``, each leaving assets to train on (:func:`split_assets`' ``block``)."""
    _, rest, n_val = _split_parts(grid, cfg)
    return max(1, min(int(wanted), (len(rest) - 1) // n_val))


def split_assets(grid: pd.DataFrame, cfg: SplitConfig, block: int = 0) -> dict[str, list[str]]:
    """Assets per split (train/val/test), never rows.

    C-MAPSS-style data whose ``set`` column marks test units keeps them as the test split
    and draws validation units from the rest; otherwise assets are drawn at random.
    ``block``: which block of the drawn non-test assets validates (0: the first; block ``i``
    trains on every other non-test asset, so the blocks' models cross-fit the validation).
    """
    test, rest, n_val = _split_parts(grid, cfg)
    if block == 0 and not (grid[S.SET] == "test").any():
        log.info("no test units in the data: %d of %d assets held out for test and %d for validation "
                 "(split by asset, seed %d)", len(test), len(test) + len(rest), n_val, cfg.seed)
    val = rest[block * n_val : (block + 1) * n_val]
    train = rest[~np.isin(rest, val)]
    if len(val) == 0:
        raise ValueError(f"validation block {block} of {n_val} assets is past the {len(rest)} non-test assets")
    if len(train) == 0:
        from infra.errors import DataValidationError

        raise DataValidationError(
            f"only {len(test) + len(rest)} assets: too few to split into train, validation and test")
    return {"train": sorted(train), "val": sorted(val), "test": sorted(test)}


def labelled_assets(grid: pd.DataFrame, train: list[str], fraction: float, seed: int = 0) -> list[str]:
    """The labelled share of the training assets with an observed failure.

    Nested across fractions for one seed (the 5% set is inside the 20% set), at least one.
    """
    failed = grid.loc[grid[S.FAILED].to_numpy() & grid[S.ASSET].isin(train), S.ASSET].unique().astype(str)
    if len(failed) == 0:
        from infra.errors import DataValidationError

        raise DataValidationError(
            "no training asset has a failure event: supervised training needs failures (events table)"
        )
    order = np.random.default_rng(seed + 7919).permutation(np.sort(failed))
    k = max(1, int(np.ceil(fraction * len(order))))
    return sorted(order[:k].tolist())


def rows_of(grid: pd.DataFrame, assets: list[str]) -> pd.DataFrame:
    return grid.loc[grid[S.ASSET].isin(assets)]


def cut_test_assets(
    grid: pd.DataFrame, assets: list[str], length: int, seed: int = 0, cuts: int = 1, max_rul: int = 200
) -> pd.DataFrame:
    """Cut each failed test asset before its failure, as the C-MAPSS test files are.

    With ``cuts`` > 1 each asset is cut that many times at random points, as separate
    units ``<asset>@<k>``. Assets already cut (``set == test``, e.g. C-MAPSS) and censored
    ones are kept as they are.
    """
    rng = np.random.default_rng(seed + 104729)
    parts = []
    for a, g in rows_of(grid, assets).groupby(S.ASSET, sort=True):
        if g[S.SET].iloc[0] == "test" or not g[S.FAILED].iloc[0]:
            parts.append(g)
            continue
        hi = int(min(len(g) - length, max_rul))
        for k in range(cuts):
            cut = int(rng.integers(1, hi + 1)) if hi >= 1 else 0
            part = g.loc[g[S.RUL] >= cut].copy()
            if cuts > 1:
                part[S.ASSET] = f"{a}@{k + 1}"
            parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else grid.iloc[:0]


def fit_normalizer(grid: pd.DataFrame, assets: list[str], cfg: WindowConfig, op_prefix: str, seed: int = 0) -> RegimeNormalizer:
    return RegimeNormalizer(cfg.n_regimes, op_prefix, seed, age=cfg.age_channel).fit(rows_of(grid, assets))


@dataclass
class SupervisedData:
    """Windows of each split for supervised training and evaluation."""

    train: WindowSet
    val: WindowSet
    test_last: WindowSet  # last window of each cut test asset (RUL protocol)
    test_all: WindowSet  # every window of each failed test asset (alerts, trajectories)
    test_cut_grid: pd.DataFrame  # the cut test assets (to re-score another model on them)
    #: last window of each random cut of the validation assets (``WindowConfig.val_cuts``); None: RUL
    #: validation uses every validation window
    val_cut: WindowSet | None = None

    @property
    def rul_val(self) -> WindowSet:
        """The windows RUL validation scores (early stopping, the candidate choice): the cut
        validation assets' last windows when ``val_cuts`` is set, else every validation window."""
        return self.val_cut if self.val_cut is not None else self.val

    def window_counts(self) -> dict[str, int]:
        """Windows per part."""
        return {"train": len(self.train), "val": len(self.val), "test_last": len(self.test_last),
                "test_all": len(self.test_all)} | ({"val_cut": len(self.val_cut)} if self.val_cut is not None else {})


def supervised_windows(
    grid: pd.DataFrame,
    splits: dict[str, list[str]],
    labelled: list[str],
    normalizer: RegimeNormalizer,
    cfg: WindowConfig,
    report: BadReadingReport,
    seed: int = 0,
) -> SupervisedData:
    """Windows for training (labelled assets), validation and the test protocols."""
    kw = {"length": cfg.length, "rul_cap": cfg.rul_cap, "horizon": cfg.horizon}
    stride = cfg.stride or DEFAULT_STRIDE
    train = make_windows(rows_of(grid, labelled), normalizer, stride=stride, pad_from=cfg.pad_from, report=report,
                         **kw).labelled()
    val = make_windows(rows_of(grid, splits["val"]), normalizer, stride=max(stride, 2), pad_from=cfg.pad_from,
                       **kw).labelled()
    val_cut = None
    if cfg.val_cuts:  # a different stream of cuts from the test assets' (seed + 1)
        cut_val = cut_test_assets(rows_of(grid, splits["val"]), splits["val"], min(cfg.length, TEST_MIN_STEPS),
                                  seed + 1, cuts=cfg.val_cuts)
        val_cut = make_windows(cut_val, normalizer, last_only=True, pad=True, **kw).labelled()
    test_grid = rows_of(grid, splits["test"])
    cut = cut_test_assets(test_grid, splits["test"], min(cfg.length, TEST_MIN_STEPS), seed, cuts=cfg.test_cuts)
    test_last = make_windows(cut, normalizer, last_only=True, pad=True, report=report, **kw).labelled()
    full = test_grid.loc[test_grid[S.SET] != "test"] if (test_grid[S.SET] != "test").any() else test_grid
    test_all = make_windows(full, normalizer, stride=1, **kw).labelled()
    if len(train) == 0 or len(val) == 0 or len(test_last) == 0 or (val_cut is not None and len(val_cut) == 0):
        from infra.errors import DataValidationError

        raise DataValidationError(
            f"too few labelled windows (train {len(train)}, val {len(val)}, test {len(test_last)}) for windows "
            f"of {cfg.length} steps; use shorter windows or more assets"
        )
    return SupervisedData(train, val, test_last, test_all, cut, val_cut)


def pretrain_windows(grid: pd.DataFrame, splits: dict[str, list[str]], normalizer: RegimeNormalizer, cfg: WindowConfig, stride: int) -> tuple[WindowSet, WindowSet]:
    """Unlabelled windows of every non-test asset (censored ones included) for pre-training."""
    train = make_windows(rows_of(grid, splits["train"]), normalizer, length=cfg.length, stride=stride)
    val = make_windows(rows_of(grid, splits["val"]), normalizer, length=cfg.length, stride=max(stride, 4))
    return train, val


def build_pretrainer(n_channels: int, mcfg: ModelConfig, pcfg: PretrainConfig) -> MaskedReconstruction:
    """A fresh masked-reconstruction model; its initial weights follow ``pcfg.seed`` alone."""
    with seeded(pcfg.seed):
        return MaskedReconstruction(
            n_channels, mcfg.channels, mcfg.embedding_dim, mcfg.dropout, pcfg.mask_time, pcfg.mask_sensor, pcfg.lr,
            pooling=mcfg.pooling, norm=mcfg.norm, stats=mcfg.window_stats, arch=mcfg.arch,
        )


def build_predictor(n_channels: int, mcfg: ModelConfig, wcfg: WindowConfig, lr: float, fail: np.ndarray,
                    ft: FinetuneConfig | None = None, seed: int | None = None) -> SensorRULModel:
    """A fresh RUL/failure model; ``ft`` adds the training recipe (schedule, input noise); its
    initial weights follow ``seed`` alone (default: ``ft.seed``, else 0)."""
    pos = float(np.nansum(fail))
    neg = float(np.sum(~np.isnan(fail))) - pos
    recipe = {"lr_schedule": ft.lr_schedule, "input_noise": ft.input_noise} if ft is not None else {}
    seed = seed if seed is not None else (ft.seed if ft is not None else 0)
    with seeded(seed):
        return SensorRULModel(
            n_channels, mcfg.channels, mcfg.embedding_dim, mcfg.dropout, wcfg.rul_cap, mcfg.fail_weight, lr,
            pos_weight=float(np.sqrt(neg / pos)) if pos > 0 else 1.0, pooling=mcfg.pooling, norm=mcfg.norm,
            stats=mcfg.window_stats, arch=mcfg.arch, **recipe,
        )


def train_spec_fields(config: SensorConfig) -> dict[str, Any]:
    """The early-stopping fields of the supervised run's ``TrainSpec`` (the flow and the
    benches build it from these, so both train alike)."""
    ft = config.finetune
    return {"max_epochs": ft.max_epochs, "patience": ft.patience, "monitor": "val/rmse", "mode": "min",
            "seed": ft.seed, "smoothing": ft.smoothing}


def rul_extra(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    return {"phm08": phm08_score(y_true, y_pred)}


def lead_metrics(ws: WindowSet, prob: np.ndarray, threshold: float, horizon: int) -> dict[str, float]:
    return alert_lead_times(ws.asset, ws.rul_raw, prob, threshold, horizon)


def model_params(model: RULModel, normalizer: RegimeNormalizer, wcfg: WindowConfig, **extra: Any) -> dict[str, Any]:
    """JSON parameters that rebuild the model and its normalisation from the registry."""
    return {
        "architecture": type(model).__name__,
        "hparams": dict(model.hparams),
        "normalizer": normalizer.to_dict(),
        "window": wcfg.model_dump(),
        **extra,
    }


def preprocessing_from_params(params: dict[str, Any]) -> tuple[RegimeNormalizer, WindowConfig]:
    """The normaliser and window settings a registered model (or a variant of it) was trained with."""
    return RegimeNormalizer.from_dict(params["normalizer"]), WindowConfig(**params["window"])


def predictor_from_params(params: dict[str, Any], state_dict: dict[str, Any]
                          ) -> tuple[RULModel, RegimeNormalizer, WindowConfig]:
    """Rebuild a registered RUL model, one CNN or a seed ensemble of them (weights already read
    safely by the registry)."""
    model = rul_model_from_params(params)
    model.load_state_dict(state_dict)
    model.eval()
    return model, RegimeNormalizer.from_dict(params["normalizer"]), WindowConfig(**params["window"])


# ------------------------------------------------------------------------------------
# the stages of sensor-pretrain and sensor-train, as plain functions


@dataclass
class PretrainData:
    """Splits, normaliser and unlabelled windows for pre-training."""

    splits: dict[str, list[str]]
    normalizer: RegimeNormalizer
    train: WindowSet
    val: WindowSet


def pretrain_data(grid: pd.DataFrame, config: SensorConfig, wcfg: WindowConfig) -> PretrainData:
    """Split by asset, fit the normaliser on train+val, cut the unlabelled windows."""
    splits = split_assets(grid, config.split)
    norm = fit_normalizer(grid, splits["train"] + splits["val"], wcfg, config.align.op_prefix, config.split.seed)
    train, val = pretrain_windows(grid, splits, norm, wcfg, config.pretrain.stride)
    return PretrainData(splits, norm, train, val)


def pretrain_run_key(data_hash: str, config: SensorConfig, wcfg: WindowConfig) -> str:
    """Checkpoint folder key of a pre-training run (same inputs, same run: resumable)."""
    return "sensor-pre-" + stable_hash({
        "data": data_hash, "model": config.model.model_dump(), "pretrain": config.pretrain.model_dump(),
        "window": wcfg.model_dump(), "split": config.split.model_dump(), "v": "1",
    })


def encoder_params(module: MaskedReconstruction, data: PretrainData, wcfg: WindowConfig, config: SensorConfig) -> dict[str, Any]:
    """JSON parameters registered with a pre-trained encoder."""
    return {
        "architecture": "MaskedReconstruction", "hparams": dict(module.hparams), "normalizer": data.normalizer.to_dict(),
        "window": wcfg.model_dump(), "split": config.split.model_dump(),
    }


def encoder_fits(params: dict[str, Any], mcfg: ModelConfig) -> bool:
    """Whether a registered encoder (its registry params) has the shapes ``mcfg`` builds: trunk,
    width, embedding, pooling, norm and window statistics (encoders registered before a setting
    existed have that setting's old default)."""
    hp = params.get("hparams", {})
    return (hp.get("arch", "cnn") == mcfg.arch and hp.get("channels") == mcfg.channels and hp.get("embedding_dim") == mcfg.embedding_dim
            and hp.get("pooling", "meanmax") == mcfg.pooling and hp.get("norm", "batch") == mcfg.norm
            and bool(hp.get("stats", False)) == mcfg.window_stats)


def encoder_for(registry: ModelRegistry, name: str, data_hash: str, mcfg: ModelConfig | None = None) -> ModelRef | None:
    """The champion encoder if it was pre-trained on this data, else the latest that was; with
    ``mcfg``, only one whose shapes it builds (after a model setting changed, e.g. the window
    statistics, an encoder of the old shape is not loaded: the caller pre-trains a new one)."""
    if name not in registry.models():
        return None

    def usable(v: ModelRef) -> bool:
        return v.data_hash == data_hash and (mcfg is None or encoder_fits(v.params, mcfg))

    champion = registry.champion(name)
    if champion is not None and usable(champion):
        return champion
    same = [v for v in registry.versions(name) if usable(v)]
    return same[-1] if same else None


@dataclass
class SupervisedSetup:
    """Everything supervised training needs besides the model."""

    splits: dict[str, list[str]]
    labelled: list[str]
    normalizer: RegimeNormalizer
    data: SupervisedData
    report: BadReadingReport  # the grid's counts, plus the assets skipped or padded for windows


def supervised_setup(grid: pd.DataFrame, config: SensorConfig, wcfg: WindowConfig, report: BadReadingReport,
                     normalizer: RegimeNormalizer | None = None, block: int = 0) -> SupervisedSetup:
    """Splits, the labelled share of the training assets and the windows of every split.

    ``normalizer``: the pre-trained encoder's (fine-tuning); None fits one on train+val.
    ``block``: the validation block (:func:`split_assets`).
    """
    ft = config.finetune
    report = report.model_copy(deep=True)
    splits = split_assets(grid, config.split, block)
    norm = normalizer or fit_normalizer(grid, splits["train"] + splits["val"], wcfg, config.align.op_prefix, config.split.seed)
    labelled = labelled_assets(grid, splits["train"], ft.label_fraction, ft.seed)
    data = supervised_windows(grid, splits, labelled, norm, wcfg, report, config.split.seed)
    log.info("label fraction %.0f%%: %d labelled assets, %d windows", 100 * ft.label_fraction, len(labelled), len(data.train))
    return SupervisedSetup(splits, labelled, norm, data, report)


def new_predictor(setup: SupervisedSetup, config: SensorConfig, wcfg: WindowConfig,
                  encoder_state: dict[str, Any] | None = None) -> tuple[SensorRULModel, WindowDataModule]:
    """A fresh RUL/failure model (with the pre-trained encoder's weights, if given) and its data."""
    ft, data = config.finetune, setup.data
    model = build_predictor(len(setup.normalizer.channels_), config.model, wcfg, ft.lr, data.train.fail, ft)
    if encoder_state is not None:
        model.load_encoder(encoder_state)
    dm = WindowDataModule(
        (data.train.x, data.train.rul, data.train.fail), (data.rul_val.x, data.rul_val.rul, data.rul_val.fail),
        ft.batch_size, ft.min_samples_per_epoch, ft.seed,
    )
    return model, dm


def member_config(config: SensorConfig, member: int) -> SensorConfig:
    """The config that trains seed-ensemble member ``member`` (0 is the configured run): its
    fine-tuning seed (initial weights, batch order, run key) is the configured one + ``member``."""
    if member == 0:
        return config
    ft = config.finetune
    return config.model_copy(update={"finetune": ft.model_copy(update={"seed": ft.seed + member})})


def train_run_key(data_hash: str, encoder: str | None, config: SensorConfig, wcfg: WindowConfig) -> str:
    """Checkpoint folder key of a supervised run (same inputs, same run: resumable)."""
    return "sensor-rul-" + stable_hash({
        "data": data_hash, "encoder": encoder, "cfg": config.finetune.model_dump(),
        "model": config.model.model_dump(), "window": wcfg.model_dump(), "split": config.split.model_dump(), "v": "1",
    })


def unfreeze_groups(config: SensorConfig) -> tuple[str, ...]:
    """Parameter groups unfrozen one by one in progressive fine-tuning."""
    return PROGRESSIVE_GROUPS if config.finetune.mode == "progressive" else ()


def new_pretrainer(data: PretrainData, config: SensorConfig) -> tuple[MaskedReconstruction, WindowDataModule]:
    """A fresh masked-reconstruction model over the data's channels, and its windows as a datamodule."""
    pcfg = config.pretrain
    module = build_pretrainer(len(data.normalizer.channels_), config.model, pcfg)
    return module, WindowDataModule((data.train.x,), (data.val.x,), pcfg.batch_size, seed=pcfg.seed)


def encoder_metrics(best_score: float | None) -> dict[str, float]:
    """The registered metric of a pre-trained encoder (NaN when training reported none)."""
    return {ENCODER_METRIC: float(best_score if best_score is not None else np.nan)}
