"""The fraud federation's Flower server and bank client, each run as its own process:
``python -m solutions.fraud.flower_apps server|client SPEC.json``.

Why ``start_server`` / ``start_client`` and not ``ServerApp`` / ``ClientApp`` (checked against
Flower's docs and 1.32.1's code, 2026-12-06): Flower's current API runs a ``ServerApp`` and a
``ClientApp`` only inside its own runtimes. The deployment runtime needs a SuperLink, one SuperNode
per bank and a run submitted with ``flwr run`` as a built app bundle (FAB) installed into Flower's
home; the SuperLink and each SuperNode then start ``flwr-serverapp`` / ``flwr-clientapp`` processes
of their own (``--isolation subprocess``), or wait for them to be started against their app I/O APIs
(``--isolation process``). The older ``flower-server-app APP`` and ``flower-supernode APP``, which
loaded an app object from a module, are gone (1.32.1 ships neither). The simulation runtime runs the
banks as virtual nodes of one runtime on Ray (``flwr[simulation]``), without a process per bank. So the Message API would cost three long-lived processes plus
one per app per run and a bundle per code change, and it is not how a test starts a federation in
seconds. The compatibility entry points (deprecated since 1.13, still shipped and documented in
``flwr.server`` / ``flwr.client``) start one gRPC server and one process per bank on 127.0.0.1, each
importing torch once. When they go, the move is to SuperLink + SuperNodes with this module's
strategy and client as the ``ServerApp`` / ``ClientApp`` of a FAB. Flower is pinned to 1.32.1 (the
``federated`` extra): the newest release that resolves with the serving stack (pyproject.toml).

Round 1 is the moments round (each bank shares feature moments and vocabularies, never rows);
rounds 2.. train with FedAvg weighted by train rows. With ``share_terminal_stats`` a terminals round
comes first: each bank shares its terminals' daily counts, the server sums them and sends the totals
with the moments round.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from infra.errors import InfrastructureError
from infra.tables import TimeSplit
from solutions.fraud import federated as FD
from solutions.fraud.config import ClientFault, FederateConfig, SequenceModelConfig

#: How to install what the federation needs (Flower, and Opacus for DP-SGD): the ``federated`` extra.
FEDERATED_EXTRA = 'pip install -e ".[federated]"'
ROUNDS_FILE = "rounds.jsonl"
FINAL_FILE = "global.npz"
ROUND_FILE = "round-{:03d}.npz"  # each training round's global weights (the flow registers the best)
SUMMARY_FILE = "federation.json"
TERMINALS_FILE = "terminal_totals.json"  # the summed terminal day counts (share_terminal_stats)


class ClientSpec(BaseModel):
    """What one bank's process is given: its partition only, the shared split and settings."""

    model_config = ConfigDict(frozen=True)

    address: str
    partition: FD.BankPartition
    bounds: TimeSplit
    delay_days: float
    model: SequenceModelConfig
    rounds: int
    local_epochs: int
    dp: FD.DPSettings | None = None
    fault: ClientFault = ClientFault()
    run_dir: str
    keep_local_optimizer: bool = False
    share_terminal_stats: bool = False


class ServerSpec(BaseModel):
    """What the server process is given (no data)."""

    model_config = ConfigDict(frozen=True)

    address: str
    clients: int
    min_clients: int
    rounds: int
    round_timeout_s: float
    connect_timeout_s: float
    model: SequenceModelConfig
    dp: bool
    run_dir: str
    server_learning_rate: float = 1.0
    server_momentum: float = 0.0
    share_terminal_stats: bool = False

    def setup_rounds(self) -> int:
        """Flower rounds before the first training round: the moments round, after the
        terminals round when terminal statistics are shared."""
        return 2 if self.share_terminal_stats else 1


# ------------------------------------------------------------------------------------
# client


def run_client(spec: ClientSpec) -> int:
    """Load and validate the bank's own partition, then serve the federation's rounds."""
    import torch
    from flwr.client import NumPyClient, start_client

    torch.set_num_threads(1)
    run_dir = Path(spec.run_dir)
    try:
        data = FD.load_bank(spec.partition, spec.bounds, spec.delay_days)
    except FD.BankRefused as exc:
        (run_dir / f"refused-{spec.partition.bank}.json").write_text(json.dumps({"bank": spec.partition.bank,
                                                                                 "error": str(exc)}))
        print(f"error: {exc}", file=sys.stderr)
        return 2
    state: dict[str, Any] = {"data": data}

    def ensure(config: dict[str, Any]) -> tuple[Any, FD.BankSetup]:
        if "bank" not in state:
            pre = FD.FraudPreprocessor.from_dict(json.loads(config["preprocessor"]))
            state["bank"] = FD.bank_setup(state["data"], pre, spec.model)
            state["model"] = FD.initial_model(pre, spec.model, float(config["pos_weight"]))
            if spec.dp is not None:
                state["privacy"] = FD.privacy_for(spec.dp, state["bank"].n_train(), spec.model.batch_size)
        return state["model"], state["bank"]

    class Bank(NumPyClient):
        def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
            return []

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
            if config.get("phase") == "terminals":  # only a bank whose own settings agree to share them
                if not spec.share_terminal_stats:
                    raise RuntimeError(f"bank {data.bank} was not configured to share terminal statistics")
                return [], 0, {"terminals": json.dumps(FD.terminal_day_counts(data)), "bank": data.bank}
            if config.get("phase") == "moments":
                if "terminal_totals" in config:  # the banks' summed terminal counts: recompute those features
                    state["data"] = FD.with_shared_terminals(data, json.loads(config["terminal_totals"]),
                                                             spec.delay_days)
                moments = FD.local_moments(state["data"], spec.model)
                return [], 0, {"moments": json.dumps(moments), "sha256": data.sha256,
                               "rows": json.dumps(data.rows()), "bank": data.bank}
            rnd = int(config["round"])
            if spec.fault.crash_round == rnd:
                os._exit(3)
            if spec.fault.slow_round == rnd:
                time.sleep(spec.fault.slow_s)
            model, bank = ensure(config)
            FD.set_weights(model, parameters)
            fit = FD.train_local(model, bank, spec.model, spec.local_epochs, seed=spec.model.seed + 1000 * rnd
                                 + data.bank, privacy=state.get("privacy"), optimizer_state=state.get("optimizer"))
            if spec.keep_local_optimizer:
                state["optimizer"] = fit.optimizer_state
            metrics: dict[str, Any] = {"bank": data.bank, "loss": fit.loss, "steps": fit.steps}
            if fit.epsilon is not None:
                metrics.update(epsilon=fit.epsilon, noise_multiplier=state["privacy"].noise_multiplier,
                               sample_rate=state["privacy"].sample_rate)
            return FD.get_weights(model), fit.examples, metrics

        def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
            model, bank = ensure(config)
            FD.set_weights(model, parameters)
            y, s = FD.bank_scores(model, bank, "val")
            m = FD.ranking_metrics(y, s)
            return 0.0, max(1, len(y)), {"bank": data.bank, "val_ap": m["ap"], "val_roc_auc": m["roc_auc"]}

    wait_for_server(spec.address, SERVER_WAIT_S)
    start_client(server_address=spec.address, client=Bank().to_client(), insecure=True)
    return 0


#: How long the server may outlive the last bank process before the federation is stopped (seconds):
#: a server whose banks all died (not refused, not faulted by a test) waits for them without end.
BANKS_GONE_GRACE_S = 60.0

#: How long a bank waits for the server to accept connections before it gives up (seconds).
SERVER_WAIT_S = 180.0


def wait_for_server(address: str, timeout_s: float) -> None:
    """Return once ``host:port`` accepts a TCP connection. A bank started before the server
    listened was refused once by Flower's client and died, and the server then waited for it
    for good (a CI run hung); RuntimeError after ``timeout_s``."""
    import socket

    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the federation server at {address} accepted no connection "
                                   f"within {timeout_s:g} s") from None
            time.sleep(0.2)


# ------------------------------------------------------------------------------------
# server


def strategy_for(spec: ServerSpec):
    """The server's Flower strategy: a moments round (the shared preprocessor), then FedAvg
    rounds with FedAvgM's server step, each written to ``rounds.jsonl``."""
    from flwr.common import EvaluateIns, FitIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvgM

    run_dir = Path(spec.run_dir)
    log = run_dir / ROUNDS_FILE
    setup = spec.setup_rounds()  # the Flower round that is the moments round

    class FederatedFraud(FedAvgM):
        """FedAvg (with FedAvgM's server step and momentum when set) after a moments round; every
        round written to ``rounds.jsonl``."""

        def __init__(self) -> None:
            super().__init__(fraction_fit=1.0, fraction_evaluate=1.0, min_fit_clients=spec.min_clients,
                             min_evaluate_clients=spec.min_clients, min_available_clients=spec.min_clients,
                             accept_failures=True, server_learning_rate=spec.server_learning_rate,
                             server_momentum=spec.server_momentum, fit_metrics_aggregation_fn=lambda _: {})
            self.config: dict[str, Any] = {}
            self.banks: dict[int, dict[str, Any]] = {}
            self.current: dict[str, Any] = {}
            self.evaluated: Any = None  # the global weights this round's banks evaluate
            self.terminal_totals: str | None = None  # the summed terminal day counts (JSON), when shared

        def initialize_parameters(self, client_manager):
            deadline = time.monotonic() + spec.connect_timeout_s
            while time.monotonic() < deadline:  # every bank connected or refused
                refused = len(list(run_dir.glob("refused-*.json")))
                if client_manager.num_available() + refused >= spec.clients:
                    break
                time.sleep(0.2)
            return ndarrays_to_parameters([])

        def configure_fit(self, server_round, parameters, client_manager):
            if server_round < setup:
                config = {"phase": "terminals"}
            elif server_round == setup:
                config = {"phase": "moments", **({"terminal_totals": self.terminal_totals}
                                                 if self.terminal_totals is not None else {})}
            else:
                config = {**self.config, "round": server_round - setup}
            clients = client_manager.sample(num_clients=max(spec.min_clients, client_manager.num_available()),
                                            min_num_clients=spec.min_clients)
            self.current = {"round": server_round - setup, "sampled": len(clients), "started": time.time()}
            return [(c, FitIns(parameters, config)) for c in clients]

        def aggregate_fit(self, server_round, results, failures):
            if server_round < setup:
                shared = [json.loads(r.metrics["terminals"]) for _, r in results]
                self.terminal_totals = json.dumps(FD.merge_terminal_counts(shared))
                (run_dir / TERMINALS_FILE).write_text(self.terminal_totals)
                self._write({"round": 0, "phase": "terminals", "banks": sorted(int(r.metrics["bank"]) for _, r in results),
                             "failures": len(failures), "partial": len(results) < spec.clients})
                return ndarrays_to_parameters([]), {}
            if server_round == setup:
                shared = [json.loads(r.metrics["moments"]) for _, r in results]
                for _, r in results:
                    self.banks[int(r.metrics["bank"])] = {"sha256": r.metrics["sha256"],
                                                           "rows": json.loads(r.metrics["rows"])}
                if len({b["sha256"] for b in self.banks.values()}) != len(self.banks):
                    raise AssertionError("two banks reported the same partition")
                pre, pos, neg = FD.merge_moments(shared)
                rate = 1.0 if spec.dp else spec.model.negative_rate
                weight = FD.federated_pos_weight(pos, neg, rate)
                model = FD.initial_model(pre, spec.model, weight)
                self.config = {"preprocessor": json.dumps(pre.to_dict()), "pos_weight": weight}
                (run_dir / "preprocessor.json").write_text(self.config["preprocessor"])
                self.initial_parameters = ndarrays_to_parameters(FD.get_weights(model))  # FedAvgM's start
                self._write({"round": 0, "phase": "moments", "banks": sorted(self.banks), "failures": len(failures),
                             "partial": len(results) < spec.clients})
                return ndarrays_to_parameters(FD.get_weights(model)), {}
            # FedAvgM counts training rounds from 1 (its momentum starts there); ours start after the moments round
            aggregated, _ = super().aggregate_fit(server_round - setup, results, failures)
            per_bank = {int(r.metrics["bank"]): {k: v for k, v in r.metrics.items() if k != "bank"}
                        for _, r in results}
            self.current.update(phase="train", ok=len(results), failures=len(failures),
                                partial=len(results) < spec.clients, banks=per_bank,
                                loss=float(np.average([r.metrics["loss"] for _, r in results],
                                                      weights=[r.num_examples for _, r in results]))
                                if results else None)
            if aggregated is not None:
                np.savez(run_dir / FINAL_FILE, *parameters_to_ndarrays(aggregated))
            return aggregated, {}

        def configure_evaluate(self, server_round, parameters, client_manager):
            if server_round <= setup:
                return []
            clients = client_manager.sample(num_clients=max(spec.min_clients, client_manager.num_available()),
                                            min_num_clients=spec.min_clients)
            self.evaluated = parameters
            return [(c, EvaluateIns(parameters, {**self.config})) for c in clients]

        def aggregate_evaluate(self, server_round, results, failures):
            if server_round > setup:
                val = {int(r.metrics["bank"]): float(r.metrics["val_ap"]) for _, r in results}
                rows = {int(r.metrics["bank"]): r.num_examples for _, r in results}
                np.savez(run_dir / ROUND_FILE.format(server_round - setup), *parameters_to_ndarrays(self.evaluated))
                self.current.update(val_ap=val, val_rows=rows, eval_failures=len(failures),
                                    seconds=time.time() - self.current.pop("started", time.time()))
                self._write(self.current)
            return None, {}

        def evaluate(self, server_round, parameters):
            return None

        def _write(self, row: dict[str, Any]) -> None:
            with open(log, "a") as f:
                f.write(json.dumps(row, default=float) + "\n")

    return FederatedFraud()


def run_server(spec: ServerSpec) -> int:
    """Serve ``rounds`` training rounds (after the moments round); write the summary."""
    from flwr.server import ServerConfig, start_server

    strategy = strategy_for(spec)
    start_server(server_address=spec.address, strategy=strategy,
                 config=ServerConfig(num_rounds=spec.rounds + spec.setup_rounds(), round_timeout=spec.round_timeout_s))
    Path(spec.run_dir, SUMMARY_FILE).write_text(json.dumps({"banks": strategy.banks}))
    return 0


# ------------------------------------------------------------------------------------
# the whole federation on this machine


class FederationOutcome(BaseModel):
    """What a finished federation leaves: the global weights' file (the best validation round's,
    or the last round's), the rounds, the banks."""

    weights: str | None
    best_round: int | None = None  # the training round whose weights ``weights`` holds, when not the last
    preprocessor: dict[str, Any] | None
    rounds: list[dict[str, Any]]
    banks: dict[str, dict[str, Any]]
    exit_codes: dict[str, int | None]
    refused: dict[int, str]
    terminal_totals: dict[str, list] | None = None  # the summed terminal day counts (share_terminal_stats)


def read_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """The rounds the server has written so far."""
    path = run_dir / ROUNDS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def require_federated_packages(dp: bool) -> None:
    """Raise :class:`InfrastructureError` naming the extra to install when Flower (or, with
    differential privacy, Opacus) is not installed, before any process starts."""
    missing = [name for name, needed in (("flwr", True), ("opacus", dp))
               if needed and importlib.util.find_spec(name) is None]
    if missing:
        raise InfrastructureError(f"federated training needs {' and '.join(missing)}, not installed here: "
                                  f"install the federated extra ({FEDERATED_EXTRA})")


def run_federation(parts: list[FD.BankPartition], bounds: TimeSplit, cfg: FederateConfig, run_dir: Path,
                   faults: dict[int, ClientFault] | None = None, on_round: Any = None,
                   timeout_s: float = 3600) -> FederationOutcome:
    """Start the server and one process per bank on 127.0.0.1, wait for the last round
    (``on_round(rounds)`` whenever a round is written), stop every process."""
    from infra.processes import ProcessGroup, free_port

    fed = cfg.federation
    require_federated_packages(dp=bool(fed.dp_epsilon))
    run_dir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{fed.port or free_port()}"
    dp = (FD.DPSettings(epsilon=fed.dp_epsilon, delta=fed.dp_delta, max_grad_norm=fed.dp_max_grad_norm,
                        rounds=fed.rounds, local_epochs=fed.epochs_per_round()) if fed.dp_epsilon else None)
    server = ServerSpec(address=address, clients=len(parts), min_clients=min(fed.needed(), len(parts)),
                        rounds=fed.rounds, round_timeout_s=fed.round_timeout_s,
                        connect_timeout_s=fed.connect_timeout_s, model=cfg.model, dp=dp is not None,
                        run_dir=str(run_dir), server_learning_rate=fed.server_learning_rate,
                        server_momentum=fed.server_momentum, share_terminal_stats=fed.share_terminal_stats)
    (run_dir / "server.json").write_text(server.model_dump_json())
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    seen = [0]
    banks_gone_since: float | None = None  # when every bank process was first seen exited

    def poll() -> None:
        nonlocal banks_gone_since
        rounds = read_rounds(run_dir)
        if on_round is not None and len(rounds) > seen[0]:
            seen[0] = len(rounds)
            on_round(rounds)
        banks = [c for c in group.children if c.name.startswith("bank-")]
        if banks and main.proc.poll() is None and all(c.proc.poll() is not None for c in banks):
            banks_gone_since = banks_gone_since or time.monotonic()
            if time.monotonic() - banks_gone_since > BANKS_GONE_GRACE_S:  # the server would wait for them for good
                tails = "; ".join(f"{c.name} exit {c.proc.returncode}: {c.tail(300).strip()[-200:]}" for c in banks)
                raise RuntimeError(f"every bank process exited and the federation server is still waiting "
                                   f"(logs in {run_dir / 'logs'}): {tails}")

    with ProcessGroup(run_dir / "logs") as group:
        main = group.start("server", "solutions.fraud.flower_apps", ["server", str(run_dir / "server.json")], env)
        for part in parts:
            spec = ClientSpec(address=address, partition=part, bounds=bounds, delay_days=cfg.delay_days,
                              model=fed.client_model(cfg.model), rounds=fed.rounds, local_epochs=fed.epochs_per_round(), dp=dp,
                              fault=(faults or {}).get(part.bank, ClientFault()), run_dir=str(run_dir),
                              keep_local_optimizer=fed.keep_local_optimizer,
                              share_terminal_stats=fed.share_terminal_stats)
            path = run_dir / f"client-{part.bank}.json"
            path.write_text(spec.model_dump_json())
            group.start(f"bank-{part.bank}", "solutions.fraud.flower_apps", ["client", str(path)], env)
        code = group.wait(main, timeout_s, poll)
        if code != 0:
            raise RuntimeError(f"the federation server failed (exit {code}): {main.tail()}")
        time.sleep(0.5)
        group.stop()
        codes = {c.name: c.proc.returncode for c in group.children}
    refused = {int(json.loads(p.read_text())["bank"]): json.loads(p.read_text())["error"]
               for p in run_dir.glob("refused-*.json")}
    summary = json.loads((run_dir / SUMMARY_FILE).read_text()) if (run_dir / SUMMARY_FILE).exists() else {}
    pre, terminals = run_dir / "preprocessor.json", run_dir / TERMINALS_FILE
    rounds = read_rounds(run_dir)
    chosen = best_round(rounds) if fed.selects_best_round() else None
    weights = run_dir / (ROUND_FILE.format(chosen) if chosen is not None else FINAL_FILE)
    if chosen is not None and not weights.exists():
        weights, chosen = run_dir / FINAL_FILE, None
    return FederationOutcome(weights=str(weights) if weights.exists() else None, best_round=chosen,
                             preprocessor=json.loads(pre.read_text()) if pre.exists() else None,
                             rounds=rounds, banks={str(k): v for k, v in summary.get("banks", {}).items()},
                             exit_codes=codes, refused=refused,
                             terminal_totals=json.loads(terminals.read_text()) if terminals.exists() else None)


def best_round(rounds: list[dict[str, Any]]) -> int | None:
    """The training round whose global model scored the best validation AP, averaged over the
    banks that evaluated the last round (weighted by their validation rows), among the rounds
    every one of those banks evaluated; banks without a finite AP (no fraud in their validation
    days) are left out. ``None`` when no round was evaluated. A bank that crashed for good thus
    does not pin the choice to the rounds before its crash."""
    evaluated = [r for r in rounds if r.get("phase") == "train" and r.get("val_ap")]
    if not evaluated:
        return None
    survivors = set(evaluated[-1]["val_ap"])
    best, best_ap = None, -math.inf
    for r in evaluated:
        if not survivors <= set(r["val_ap"]):
            continue
        pairs = [(float(r["val_ap"][b]), float(r.get("val_rows", {}).get(b, 1))) for b in survivors]
        pairs = [(ap, n) for ap, n in pairs if math.isfinite(ap) and n > 0]
        if pairs:
            ap = float(np.average([a for a, _ in pairs], weights=[n for _, n in pairs]))
            if ap > best_ap:
                best, best_ap = int(r["round"]), ap
    return best


def load_weights(path: str) -> list[np.ndarray]:
    """The global weights a federation wrote, in ``state_dict`` order."""
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("server", "client"):
        print("usage: python -m solutions.fraud.flower_apps server|client SPEC.json", file=sys.stderr)
        return 2
    text = Path(argv[1]).read_text()
    if argv[0] == "server":
        return run_server(ServerSpec.model_validate_json(text))
    return run_client(ClientSpec.model_validate_json(text))


if __name__ == "__main__":
    sys.exit(main())
