"""The fraud sequence model's compression adapter: rebuild, held-out data, metric, student.

Plain torch / pandas (no Prefect): the compress flow receives :data:`ADAPTER` and does
the rest generically. The held-out data is the test period of the model's own split, on
the transactions file given (mapped to the canonical columns) or on the seeded synthetic
data; the metric is average precision (the registry's ``test/auprc``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import average_precision_score
from torch import nn

from infra.compression import CompressTarget, ModelAdapter, table_fingerprint
from infra.errors import DataValidationError
from infra.registry import ModelRef
from infra.tables import assign_periods, read_table, time_split, validate_table
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import FraudHeldOut, SequenceModelConfig, SplitConfig
from solutions.fraud.model import FraudSequenceModel, build_module
from solutions.fraud.schema import ColumnMapping
from solutions.fraud.sequences import FraudPreprocessor
from solutions.fraud.synthetic import generate_transactions

log = logging.getLogger(__name__)

#: The window features' label delay (days) of the sequence model's context features.
FEATURE_DELAY_DAYS = 7.0
#: The inputs the sequence model reads from a batch (ONNX input names).
INPUT_NAMES = ["step_num", "step_cat", "ctx_num", "ctx_cat"]


# ------------------------------------------------------------------------------------
# held-out data


def _existing(path: str | None, what: str) -> None:
    if path is not None and not Path(path).expanduser().is_file():
        raise DataValidationError(f"{what} not found (or not a file)", source=path)


def check_options(options: FraudHeldOut) -> None:
    """The files exist and the column mapping names canonical columns (before any data is read)."""
    try:
        ColumnMapping(options.columns)
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    _existing(options.data, "transactions file")
    _existing(options.accounts, "accounts file")


def load_transactions(options: FraudHeldOut) -> tuple[pd.DataFrame, str]:
    """The transactions (canonical columns and dtypes) and where they came from."""
    check_options(options)
    if options.data is None:
        c = options.synthetic
        raw = generate_transactions(n_accounts=c.n_accounts, n_terminals=c.n_terminals, n_days=c.n_days,
                                    fraud_rate=c.fraud_rate, seed=c.seed, new_pattern=c.new_pattern)
        source = f"synthetic data (seed {c.seed})"
    else:
        source = options.data
        try:
            raw = ColumnMapping(options.columns).apply(read_table(Path(options.data).expanduser()))
        except ValueError as exc:  # a mapping naming a column the file lacks
            raise DataValidationError(str(exc), source=source) from exc
    df = validate_table(raw, P.transaction_schema(), source)
    if options.accounts:
        accounts = read_table(Path(options.accounts).expanduser())
        df = P.merge_accounts(df, validate_table(accounts, P.accounts_schema(), options.accounts))
    return df, source


# ------------------------------------------------------------------------------------
# the adapter


def student_of(params: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """A fresh, smaller sequence model (half the GRU, a quarter of the MLP) and its registry params."""
    hp = dict(params["hparams"])
    hp.update(hidden=max(8, int(hp.get("hidden", 64)) // 2), mlp_hidden=max(8, int(hp.get("mlp_hidden", 128)) // 4))
    return FraudSequenceModel(**hp), {**params, "hparams": hp}


def average_precision(y: np.ndarray, out: np.ndarray) -> float:
    """PR-AUC (average precision) of raw model outputs."""
    return float(average_precision_score(y, out))


def prepare(ref: ModelRef, model: nn.Module, options: FraudHeldOut) -> CompressTarget:
    """The compress target of a registered fraud model: its test period, scored by average precision."""
    df, source = load_transactions(options)
    split = SplitConfig(**ref.params.get("split", {}))
    bounds = time_split(df[S.TIMESTAMP], train_days=split.train_days, delay_days=split.delay_days,
                        test_days=split.test_days, val_days=split.val_days)
    periods, period_text = assign_periods(df[S.TIMESTAMP], bounds), bounds.describe()
    feats = P.build_features(df, periods, FEATURE_DELAY_DAYS)
    pre = FraudPreprocessor.from_dict(ref.params["preprocessor"])
    setup = P.sequence_setup(df, feats, SequenceModelConfig(**ref.params["config"]), preprocessor=pre)
    batches = [dict(b) for b in setup.datamodule.test_dataloader()]
    labels = torch.cat([b["y"] for b in batches]).numpy().astype("int64")
    train_y = df.loc[periods == "train", S.LABEL].to_numpy(dtype="float64")
    return CompressTarget(
        model=model,
        test_batches=batches,
        labels=labels,
        metric=average_precision,
        primary_metric=ref.primary_metric,
        higher_is_better=ref.higher_is_better,
        input_names=list(INPUT_NAMES),
        datamodule=setup.datamodule,
        make_student=lambda: student_of(ref.params),
        pos_weight=P.pos_weight_for(train_y),
        data_hash=table_fingerprint(df),
        data_note=f"the {period_text} period of {source}",
    )


ADAPTER = ModelAdapter(architecture="FraudSequenceModel", build=build_module, prepare=prepare, options=FraudHeldOut,
                       check=check_options)
