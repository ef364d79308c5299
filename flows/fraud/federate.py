"""``fraud-federate``: banks train one sequence model without sharing a row (Flower, optional DP-SGD).

The steps are thin tasks over :mod:`solutions.fraud.federated` and
:mod:`solutions.fraud.flower_apps`; the flow body wires them.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NONE
from pydantic import BaseModel

from flows.fraud.steps import PRIMARY_METRIC, obtain_transactions, publish_report
from infra.home import home_layout
from infra.registry import ModelRegistry, PromotionDecision
from infra.tables import TimeSplit, time_split
from solutions.fraud import card as FC
from solutions.fraud import federated as FD
from solutions.fraud import flower_apps as FA
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import ClientFault, FederateConfig
from tasks.approval import approval_gate
from tasks.cards import Section, build_card, intervals, publish_card, write_card
from tasks.data import DatasetRef
from tasks.evaluate import artifact_key
from tasks.lineage import collect_lineage
from tasks.register import register_model_task


class FraudFederateResult(BaseModel):
    """What ``fraud-federate`` returns."""

    model: str | None
    promoted: bool
    rounds: list[dict[str, Any]]
    partial_rounds: list[int]
    rows_per_bank: dict[str, int]
    refused: dict[int, str]
    metrics: dict[str, dict[str, float | None]]
    epsilon: dict[str, float] | None
    best_round: int | None = None  # the registered weights' round when chosen on validation (None: the last)
    report_dir: str
    seconds: float
    notes: list[str] = []  # what to change for the measured recipe (FederationConfig.recipe_notes)


# ------------------------------------------------------------------------------------
# steps


@task(name="partition-banks", cache_policy=NONE)
def partition_step(ref: DatasetRef, cfg: FederateConfig, out_dir: Path) -> tuple[list[FD.BankPartition], TimeSplit]:
    """One file per bank (checked disjoint) and the shared time boundaries of ``fraud train``."""
    df = ref.read()
    banks = FD.partition_banks(df, cfg.federation.clients, cfg.federation.partition_by)
    parts = FD.write_partitions(df, banks, out_dir / "banks")
    FD.check_disjoint(parts)
    sp = cfg.split
    bounds = time_split(df[S.TIMESTAMP], train_days=sp.train_days, delay_days=sp.delay_days,
                        test_days=sp.test_days, val_days=sp.val_days)
    return parts, bounds


def _round_rows(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in rounds:
        if r.get("phase") != "train":
            continue
        eps = [b.get("epsilon") for b in r.get("banks", {}).values() if b.get("epsilon") is not None]
        val = list(r.get("val_ap", {}).values())
        rows.append({"round": r["round"], "banks_ok": r.get("ok"), "failures": r.get("failures"),
                     "partial": r.get("partial"), "train_loss": r.get("loss"),
                     "mean_val_ap": float(np.nanmean(val)) if val else None,
                     "max_epsilon": max(eps) if eps else None})
    return rows


@task(name="federate", cache_policy=NONE)
def federate_step(parts: list[FD.BankPartition], bounds: TimeSplit, cfg: FederateConfig, out_dir: Path,
                  faults: dict[int, ClientFault] | None = None) -> FA.FederationOutcome:
    """Run the Flower server and one process per bank; each round updates the rounds artifact."""
    key = artifact_key("fraud-federate-rounds")

    def on_round(rounds: list[dict[str, Any]]) -> None:
        rows = _round_rows(rounds)
        if rows:
            create_table_artifact(rows, key=key, description="Federated rounds so far")

    return FA.run_federation(parts, bounds, cfg, out_dir / "federation", faults=faults, on_round=on_round)


@task(name="evaluate-federation", cache_policy=NONE)
def evaluate_step(outcome: FA.FederationOutcome, parts: list[FD.BankPartition], bounds: TimeSplit,
                  cfg: FederateConfig) -> dict[str, Any]:
    """The global model on each bank's test period and on their union; with ``compare``, pooled
    training, each bank alone and the pooled GBM on the same rows."""
    if outcome.weights is None or outcome.preprocessor is None:
        raise RuntimeError("the federation finished no training round")
    pre = FD.FraudPreprocessor.from_dict(outcome.preprocessor)
    refused = set(outcome.refused)

    def own(part: FD.BankPartition) -> FD.BankData:  # each bank's data as its process trained on it
        data = FD.load_bank(part, bounds, cfg.delay_days)
        return FD.with_shared_terminals(data, outcome.terminal_totals, cfg.delay_days) \
            if outcome.terminal_totals is not None else data

    banks = [FD.bank_setup(own(p), pre, cfg.model) for p in parts if p.bank not in refused]
    model = FD.initial_model(pre, cfg.model, 1.0)
    FD.set_weights(model, FA.load_weights(outcome.weights))
    scored = {b.data.bank: FD.bank_scores(model, b, "test") for b in banks}
    y = np.concatenate([v[0] for v in scored.values()])
    s = np.concatenate([v[1] for v in scored.values()])
    metrics = {"federated (union)": FD.ranking_metrics(y, s)}
    metrics.update({f"federated (bank {k})": FD.ranking_metrics(*v) for k, v in scored.items()})
    if cfg.compare:
        metrics.update(_comparisons(banks, pre, cfg, bounds))
    return {"model": model, "preprocessor": pre, "y": y, "s": s, "metrics": metrics,
            "rows": {str(b.data.bank): len(b.data.table) for b in banks}}


POOLING_NOTE_KEY = "pooled (shared features)"
POOLING_NOTE = ("`pooled (all rows)` and `GBM pooled` train on every bank's rows with the window features the "
                "federation's banks trained on (each bank's own rows; with --share-terminal-stats, terminal features "
                "from the banks' summed daily counts): their gap to the federated model is what federated "
                "optimisation costs. The `(shared features)` rows compute the window features over all banks' rows, "
                "so a terminal's risk counts every bank's frauds there: what a data-sharing agreement would give, "
                "the upper bound.")


def _comparisons(banks: list[FD.BankSetup], pre: FD.FraudPreprocessor, cfg: FederateConfig,
                 bounds: TimeSplit) -> dict[str, Any]:
    """Pooled training on every bank's rows with the window features the banks trained on (what
    the federation's optimisation costs), the same with window features over all rows (what a
    data-sharing agreement would give: the upper bound), each bank alone, and the pooled GBM on
    either feature set."""
    fed = cfg.federation
    epochs = fed.rounds * fed.local_epochs
    pooled_data = FD.BankData(bank=-1, table=pd.concat([b.data.table for b in banks], ignore_index=True),
                              features=pd.concat([b.data.features for b in banks], ignore_index=True), sha256="")
    pos, neg = (float(pooled_data.table.loc[pooled_data.periods() == "train", S.LABEL].sum()),
                float((pooled_data.periods() == "train").sum()))
    weight = FD.federated_pos_weight(pos, neg - pos, cfg.model.negative_rate)
    pooled = FD.bank_setup(pooled_data, pre, cfg.model)
    # the alternatives stop on validation as the federation does (its best round), else train every epoch
    train = FD.train_best_val if fed.selects_best_round() else FD.train_local
    m = FD.initial_model(pre, cfg.model, weight)
    train(m, pooled, cfg.model, epochs, seed=cfg.model.seed)
    out = {"pooled (all rows)": FD.ranking_metrics(*FD.bank_scores(m, pooled, "test"))}
    ys, ss = [], []
    for b in banks:
        alone = FD.initial_model(pre, cfg.model, weight)
        train(alone, b, cfg.model, epochs, seed=cfg.model.seed)
        y, s = FD.bank_scores(alone, b, "test")
        ys.append(y)
        ss.append(s)
        out[f"bank {b.data.bank} alone"] = FD.ranking_metrics(y, s)
    out["banks alone (union)"] = FD.ranking_metrics(np.concatenate(ys), np.concatenate(ss))
    gbm = P.fit_baseline(pooled_data.features, pooled_data.table[S.LABEL].to_numpy(), cfg.model.seed, 1)
    test = pooled_data.periods() == "test"
    out["GBM pooled"] = FD.ranking_metrics(pooled_data.table.loc[test, S.LABEL].to_numpy(),
                                           P.baseline_scores(gbm, pooled_data.features, "test"))
    # data sharing: one table, window features over all of it, its own preprocessor
    shared = FD.shared_bank([b.data for b in banks], bounds, cfg.delay_days)
    shared_pre, pos, neg = FD.merge_moments([FD.local_moments(shared, cfg.model)])
    m = FD.initial_model(shared_pre, cfg.model, FD.federated_pos_weight(pos, neg, cfg.model.negative_rate))
    shared_setup = FD.bank_setup(shared, shared_pre, cfg.model)
    train(m, shared_setup, cfg.model, epochs, seed=cfg.model.seed)
    out["pooled (shared features)"] = FD.ranking_metrics(*FD.bank_scores(m, shared_setup, "test"))
    gbm = P.fit_baseline(shared.features, shared.table[S.LABEL].to_numpy(), cfg.model.seed, 1)
    test = shared.periods() == "test"
    out["GBM pooled (shared features)"] = FD.ranking_metrics(shared.table.loc[test, S.LABEL].to_numpy(),
                                                             P.baseline_scores(gbm, shared.features, "test"))
    return out


def _epsilons(rounds: list[dict[str, Any]]) -> dict[str, float] | None:
    eps: dict[str, float] = {}
    for r in rounds:
        if r.get("phase") != "train":
            continue
        for bank, m in r.get("banks", {}).items():
            if m.get("epsilon") is not None:
                eps[f"bank {bank}"] = float(m["epsilon"])
    if not eps:
        return None
    eps["federation"] = max(eps.values())  # each row is in one bank's data: the largest bank ε holds for every row
    return eps


@task(name="register-federated", cache_policy=NONE)
def register_step(ref: DatasetRef, evaluated: dict[str, Any], outcome: FA.FederationOutcome,
                  cfg: FederateConfig, data: str | None, out_dir: Path) -> tuple[Any, str]:
    """Register the global model through the champion rule with its lineage; write its card."""
    fed = cfg.federation
    eps = _epsilons(outcome.rounds)
    privacy = ({"dp": True, "epsilon": eps, "delta": fed.dp_delta, "max_grad_norm": fed.dp_max_grad_norm,
                "batch_size": fed.client_model(cfg.model).batch_size, "learning_rate": fed.client_model(cfg.model).lr,
                "target_epsilon": fed.dp_epsilon, "accountant": "opacus RDP"} if eps else {"dp": False})
    partial = [r["round"] for r in outcome.rounds if r.get("phase") == "train" and r.get("partial")]
    federation = {"clients": fed.clients, "rounds": fed.rounds, "local_epochs": fed.epochs_per_round(),
                  "keep_local_optimizer": fed.keep_local_optimizer,
                  "strategy": ("FedAvg (weighted by train rows), moments round first"
                               if fed.server_learning_rate == 1.0 and fed.server_momentum == 0.0 else
                               f"FedAvgM (weighted by train rows; server learning rate {fed.server_learning_rate:g}, "
                               f"momentum {fed.server_momentum:g}), moments round first"),
                  "partition_by":
                  fed.partition_by or "hash(account_id)", "rows_per_client": evaluated["rows"],
                  "partial_rounds": partial, "refused": outcome.refused, "privacy": privacy,
                  "registered_round": outcome.best_round or "last",
                  "terminal_stats": "daily counts summed across banks" if fed.share_terminal_stats else "each bank's own"}
    union = evaluated["metrics"]["federated (union)"]
    params = P.model_params(evaluated["model"], evaluated["preprocessor"], cfg.model, federation=federation,
                            threshold=0.5, split=cfg.split.model_dump())
    lineage = collect_lineage(data_hash=ref.content_hash, data_source=data or "synthetic (seeded generator)",
                              rows=evaluated["rows"], seeds={"model": cfg.model.seed},
                              parameters={"config": cfg.model_dump(), "federation": federation})
    registration = register_model_task(
        cfg.model_name, evaluated["model"], params=params,
        metrics={PRIMARY_METRIC: union["ap"], "test/roc_auc": union["roc_auc"]},
        primary_metric=PRIMARY_METRIC, data_hash=ref.content_hash, lineage=lineage)
    comparison = [[name, m["ap"], m["roc_auc"]] for name, m in evaluated["metrics"].items()]
    dp_note = (f"Trained with DP-SGD (Opacus): per bank (ε, δ) = ({eps['federation']:.3g}, {fed.dp_delta:g}) spent "
               "over all rounds (RDP accountant); the moments round (feature means/variances, vocabularies, class "
               "counts) is not noised." if eps else
               "Trained WITHOUT differential privacy: the shared weight updates carry no formal privacy guarantee.")
    if fed.share_terminal_stats:
        dp_note += (" The banks shared each terminal's daily counts of transactions, known labels and frauds "
                    "(summed by the server, not noised; no account, amount or time of day): the terminal window "
                    "features count every bank's transactions.")
    card = build_card(
        registration.model, title="Federated " + FC.TITLE[0].lower() + FC.TITLE[1:], intended_use=FC.INTENDED_USE,
        features=FC.feature_names(evaluated["preprocessor"].window_feature_names),
        metrics=intervals(evaluated["y"], evaluated["s"], ["pr_auc", "roc_auc"]),
        sections=[Section(title="Test period: federated vs alternatives", columns=["model", "ap", "roc_auc"],
                          rows=comparison, note=POOLING_NOTE if POOLING_NOTE_KEY in evaluated["metrics"] else None),
                  Section(title="Privacy", columns=["bank", "epsilon"],
                          rows=[[k, v] for k, v in (eps or {}).items()], note=dp_note),
                  Section(title="Rounds", columns=list(_round_rows(outcome.rounds)[0]) if _round_rows(outcome.rounds) else [],
                          rows=[list(r.values()) for r in _round_rows(outcome.rounds)])],
        limitations=[*FC.LIMITATIONS, dp_note], promotion=registration.decision.model_dump())
    markdown = write_card(ModelRegistry(), registration.model, card)
    publish_card(markdown, registration.model.name)
    return approval_gate(registration), markdown  # a model that needs approval waits here


def _report(evaluated: dict[str, Any], outcome: FA.FederationOutcome, out_dir: Path, notes: list[str]) -> str:
    lines = ["# Federated fraud training", "", "| model | test AP | test ROC-AUC |", "|---|---|---|"]
    lines += [f"| {k} | {v['ap']:.4f} | {v['roc_auc']:.4f} |" for k, v in evaluated["metrics"].items()]
    if POOLING_NOTE_KEY in evaluated["metrics"]:
        lines += ["", POOLING_NOTE]
    rows = _round_rows(outcome.rounds)
    lines += ["", "| round | banks ok | failures | partial | train loss | mean val AP | max ε |", "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join("—" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))
                                for v in r.values()) + " |" for r in rows]
    lines += ["", f"Registered: the global model of round {outcome.best_round}, the best mean validation AP."
              if outcome.best_round is not None else "Registered: the global model of the last round."]
    if outcome.refused:
        lines += ["", "Refused banks:"] + [f"- bank {k}: {v}" for k, v in outcome.refused.items()]
    if notes:
        lines += ["", "To reach the measured recipe:"] + [f"- {note}" for note in notes]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot([r["round"] for r in rows], [r["mean_val_ap"] for r in rows], marker="o")
        ax.set_xlabel("round")
        ax.set_ylabel("mean validation AP")
        fig.tight_layout()
        fig.savefig(out_dir / "rounds.png")
        plt.close(fig)
        lines += ["", "![rounds](rounds.png)"]
    except ImportError:
        pass
    return "\n".join(lines)


# ------------------------------------------------------------------------------------
# the flow


@flow(name="fraud-federate", log_prints=True)
def fraud_federate(
    data: str | None = None,
    columns: dict[str, str] | None = None,
    config: FederateConfig = FederateConfig(),  # noqa: B008 - a typed default renders a UI form
    faults: dict[int, ClientFault] | None = None,
) -> FraudFederateResult:
    """Partition the transactions into banks, train the sequence model across them with Flower
    (each bank's process reads only its own rows; optional DP-SGD), evaluate it per bank and on
    their union against pooled, bank-alone and GBM training, and register it through the champion rule.

    Args:
        data: transactions CSV or Parquet (default: seeded synthetic data).
        columns: column mapping canonical=SOURCE,... (e.g. account_id=CUSTOMER_ID).
        config: federation (banks, rounds, DP), data, split, model and registry name.
        faults: fault injection per bank (crash or stall in a round), for drills and tests.
    """
    started = time.perf_counter()
    ref = obtain_transactions(data, columns or {}, config.data)
    out_dir = home_layout().new_report("fraud-federate")
    parts, bounds = partition_step(ref, config, out_dir)
    outcome = federate_step(parts, bounds, config, out_dir, faults)
    evaluated = evaluate_step(outcome, parts, bounds, config)
    registration, _ = register_step(ref, evaluated, outcome, config, data, out_dir)
    notes = config.federation.recipe_notes()
    publish_report(_report(evaluated, outcome, out_dir, notes), out_dir, artifact_key("fraud-federate-report"),
                   "Federated vs pooled, bank-alone and GBM on the test period")
    decision: PromotionDecision = registration.decision
    return FraudFederateResult(
        model=registration.model.spec, promoted=bool(decision.promoted), rounds=outcome.rounds,
        partial_rounds=[r["round"] for r in outcome.rounds if r.get("phase") == "train" and r.get("partial")],
        rows_per_bank={str(p.bank): p.rows for p in parts}, refused=outcome.refused,
        metrics={k: {m: (None if math.isnan(x) else x) for m, x in v.items()} for k, v in evaluated["metrics"].items()},
        epsilon=_epsilons(outcome.rounds), best_round=outcome.best_round, report_dir=str(out_dir),
        seconds=time.perf_counter() - started, notes=notes)
