"""A tiny trained fraud model, its batch ``score`` output, and a real uvicorn server serving it."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import numpy as np
import pandas as pd
import torch
import uvicorn

from flows.fraud.steps import load_scoring_model
from flows.serve import fraud as serve_fraud
from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.registry import ModelRef, ModelRegistry
from infra.serving.runtime import ServeTuning, key_store
from infra.settings import ServeSettings
from infra.tables import assign_periods, time_split, validate_table
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud import scoring as SC
from solutions.fraud.config import SequenceModelConfig
from solutions.fraud.synthetic import generate_transactions

MODEL = "fraud-seq"


@dataclass
class TinyFraud:
    """A registered tiny model and the data it is replayed on."""

    records: list[dict[str, Any]]  # the raw file's rows, in file order
    since: pd.Timestamp  # first timestamp of the scored period
    batch: pd.DataFrame  # the batch path's scores of the period (transaction_id, score)
    ref: ModelRef
    risky_rows: int  # rows of the scored period with a non-zero delayed terminal risk (labels matter)


def train_tiny_fraud(layout: HomeLayout, seed: int = 5) -> TinyFraud:
    """Generate ~3 weeks of transactions, train a few steps, register as champion, batch-score the last day."""
    return train_tiny_kinds(layout, seed, kinds=("sequence",))["sequence"]


def train_tiny_kinds(layout: HomeLayout, seed: int = 5,
                     kinds: tuple[str, ...] = ("sequence", "baseline", "ensemble")) -> dict[str, TinyFraud]:
    """As :func:`train_tiny_fraud`, and one version of every other kind asked for, registered in
    this order (the first is champion): the GBM (fitted on the train period, a skops file) and the
    ensemble of both (their mean), each with the batch ``score`` path's scores of the last day."""
    from infra.registry import KIND_SKLEARN, KIND_TORCH, KIND_TORCH_SKLEARN
    from solutions.fraud import candidates as CA

    torch.manual_seed(seed)
    raw = generate_transactions(n_accounts=30, n_terminals=12, n_days=21, fraud_rate=0.05, seed=seed)
    raw[S.TIMESTAMP] = raw[S.TIMESTAMP].astype(str)  # as a CSV or a JSON request carries it
    df = validate_table(raw, P.transaction_schema(), "tiny")
    split = time_split(df[S.TIMESTAMP], train_days=10, val_days=2, delay_days=7, test_days=1)
    feats = P.build_features(df, assign_periods(df[S.TIMESTAMP], split), 7)
    cfg = SequenceModelConfig(seq_len=8, hidden=16, mlp_hidden=32, batch_size=64)
    setup = P.sequence_setup(df, feats, cfg, periods=("train",))
    model = P.build_model(setup.preprocessor, cfg, pos_weight=3.0)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for batch in setup.datamodule.train_dataloader():
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch).float(), batch["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    registry = ModelRegistry(layout.registry())
    common = {"threshold": 0.4, "split": {"delay_days": 7}}
    seq_params = P.model_params(model, setup.preprocessor, cfg, **common)
    data = validate_table(raw.drop(columns=[S.SCENARIO]), P.transaction_schema(for_scoring=True), "tiny")
    since = pd.Timestamp(split.test_start)
    records = raw.drop(columns=[S.SCENARIO]).to_dict("records")
    risk = feats.loc[(feats[P.PERIOD] == "test").to_numpy(), [c for c in feats if c.startswith("term_risk_")]]
    gbm = CA.fit_baseline_candidate(df, feats, seed=seed, n_threads=1) if set(kinds) - {"sequence"} else None
    out: dict[str, TinyFraud] = {}
    for kind in kinds:
        if kind == "sequence":
            ref = registry.register(MODEL, model.state_dict(), params=seq_params, metrics={"test/auprc": 0.5},
                                    primary_metric="test/auprc", kind=KIND_TORCH)
        else:
            assert gbm is not None
            params = {**CA.baseline_params(gbm, 7), **common} if kind == "baseline" else {
                **seq_params, **CA.baseline_params(gbm, 7)}
            files = CA.baseline_files(gbm, layout.root / f"gbm-{kind}")
            ref = registry.register(MODEL, {} if kind == "baseline" else model.state_dict(), params=params,
                                    metrics={"test/auprc": 0.5}, primary_metric="test/auprc",
                                    kind=KIND_SKLEARN if kind == "baseline" else KIND_TORCH_SKLEARN,
                                    extra_files=files)
        if not out:
            registry.set_alias(MODEL, "champion", ref.version)
        # the batch `score` path: the flow's model loader and scoring function on the validated file
        scorer = load_scoring_model(ref, registry)
        scored = SC.score_transactions(scorer.net, scorer.preprocessor, scorer.config, ref, data, source="tiny",
                                       since=str(since), baseline=scorer.baseline)
        out[kind] = TinyFraud(records=records, since=since, batch=scored.table[[S.TRANSACTION_ID, "score"]],
                              ref=ref, risky_rows=int((risk > 0).any(axis=1).sum()))
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FraudServer:
    """``python -m flows.serve``'s app with the fraud vertical, on a real uvicorn (127.0.0.1)."""

    def __init__(self, layout: HomeLayout, **settings: Any) -> None:
        values = {"reload_poll_s": 0.2, "audit_salt": "test-salt", "fraud_model": MODEL, "sensor_model": None,
                  **settings}
        tuning = ServeTuning(**{k: values.pop(k) for k in list(values) if k in ServeTuning.__dataclass_fields__})
        self.app = create_app(ServeSettings(**values), build_verticals=[serve_fraud.build], layout=layout, tuning=tuning,
                              registry=ModelRegistry(layout.registry()))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error",
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the fraud server did not become ready"
            if self.server.started:
                try:
                    if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def api_key(layout: HomeLayout, *scopes: str) -> str:
    key, _ = key_store(layout).add("skew-test", scopes or (serve_fraud.SCOPE,))
    return key


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """A record as a client would send it (NaN -> null)."""
    return {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}


def post_scores(client: httpx.Client, url: str, key: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = client.post(f"{url}/v1/fraud/score", json={"transactions": [jsonable(r) for r in rows]},
                           headers={"X-API-Key": key}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def home_with_registry(src: HomeLayout, path: Path) -> HomeLayout:
    """A fresh home at ``path`` holding a copy of ``src``'s registry (one trained model, many servers)."""
    layout = HomeLayout(path)
    shutil.copytree(src.registry(), layout.registry(), dirs_exist_ok=True)
    return layout
