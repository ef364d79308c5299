"""Federated vs pooled vs bank-alone (and AP against ε) on synthetic or handbook data; one JSON line.

    nice -n 10 python bench/fraud_federated.py [--data /work/shared/data/fraud/handbook_...parquet
        --columns account_id=CUSTOMER_ID,...] [--clients 3 5] [--eps 1 4 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data")
    ap.add_argument("--columns", default="")
    ap.add_argument("--clients", type=int, nargs="+", default=[3])
    ap.add_argument("--eps", type=float, nargs="*", default=[])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("INDUSFLOW_HOME", tempfile.mkdtemp())
    from flows.fraud.federate import fraud_federate
    from solutions.fraud import federated as FD

    columns = dict(kv.split("=", 1) for kv in args.columns.split(",") if kv)
    out: dict = {"data": args.data or "synthetic", "rounds": args.rounds, "runs": []}
    started = time.perf_counter()
    for k in args.clients:
        for eps in [None, *args.eps] if k == args.clients[0] else [None]:
            cfg = FD.FederateConfig(federation=FD.FederationConfig(clients=k, rounds=args.rounds, dp_epsilon=eps),
                                    compare=eps is None)
            r = fraud_federate(data=args.data, columns=columns, config=cfg)
            out["runs"].append({"clients": k, "dp_epsilon": eps, "spent_epsilon": r.epsilon,
                                "partial_rounds": r.partial_rounds, "metrics": r.metrics, "seconds": round(r.seconds, 1)})
    out["seconds"] = round(time.perf_counter() - started, 1)
    out["load_average"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
