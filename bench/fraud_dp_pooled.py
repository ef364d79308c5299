"""Where DP-SGD loses average precision: clipping or noise. One bank holding every row (no
federation), trained as a Flower bank trains under DP; prints one JSON line per setting.

Each setting is ``CLIP:BATCH:LR`` (per-sample clipping norm, expected Poisson batch, AdamW
learning rate), trained for ``--epochs`` at the ε of ``--eps`` (Opacus picks the noise for the
whole run) and, with ``--no-noise``, the same with the noise off (clipping alone; ε is then
infinite). The first line is the non-private baseline: the model's own loader (negatives
subsampled), batch and learning rate.

    OMP_NUM_THREADS=1 python bench/fraud_dp_pooled.py --settings 1:2048:0.002 10:2048:0.002 \\
        10:2048:0.006 --no-noise
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", default=["1:2048:0.002", "10:2048:0.002", "10:2048:0.006"],
                    help="CLIP:BATCH:LR per DP run")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--eps", type=float, default=8.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--no-noise", action="store_true", help="also run each setting with the noise off")
    args = ap.parse_args()

    from infra.tables import assign_periods, time_split, validate_table
    from solutions.fraud import federated as FD
    from solutions.fraud import pipeline as P
    from solutions.fraud import schema as S
    from solutions.fraud.config import FederateConfig
    from solutions.fraud.synthetic import generate_transactions

    cfg = FederateConfig()
    d, sp = cfg.data, cfg.split
    raw = generate_transactions(n_accounts=d.n_accounts, n_terminals=d.n_terminals, n_days=d.n_days,
                                fraud_rate=d.fraud_rate, seed=d.seed)
    df = validate_table(raw, P.transaction_schema(), "bench")
    bounds = time_split(df[S.TIMESTAMP], train_days=sp.train_days, delay_days=sp.delay_days, val_days=sp.val_days,
                        test_days=sp.test_days)
    periods = assign_periods(df[S.TIMESTAMP], bounds)
    data = FD.BankData(bank=0, table=df, features=P.build_features(df, periods, cfg.delay_days), sha256="")

    def run(clip: float | None, batch: int | None, lr: float | None, noise: bool) -> dict:
        mcfg = cfg.model if batch is None else cfg.model.model_copy(update={"batch_size": batch, "lr": lr})
        pre, pos, neg = FD.merge_moments([FD.local_moments(data, mcfg)])
        rate = mcfg.negative_rate if clip is None else 1.0  # under DP no label-dependent subsampling
        model = FD.initial_model(pre, mcfg, FD.federated_pos_weight(pos, neg, rate))
        bank = FD.bank_setup(data, pre, mcfg)
        privacy = None
        if clip is not None:
            settings = FD.DPSettings(epsilon=args.eps, delta=args.delta, max_grad_norm=clip, rounds=1,
                                     local_epochs=args.epochs)
            privacy = FD.privacy_for(settings, bank.n_train(), mcfg.batch_size)
            if not noise:
                privacy.noise_multiplier = 0.0
        t0 = time.perf_counter()
        fit = FD.train_local(model, bank, mcfg, args.epochs, seed=0, privacy=privacy)
        metrics = FD.ranking_metrics(*FD.bank_scores(model, bank, "test"))
        return {"dp": clip is not None, "clip": clip, "noise": noise and clip is not None, "batch": mcfg.batch_size,
                "lr": mcfg.lr, "epochs": args.epochs, "steps": fit.steps,
                "noise_multiplier": None if privacy is None else privacy.noise_multiplier,
                "epsilon": fit.epsilon if noise else None, "train_rows": bank.n_train(),
                "ap": round(metrics["ap"], 4), "roc_auc": round(metrics["roc_auc"], 4),
                "seconds": round(time.perf_counter() - t0, 1), "load_avg_1m": round(os.getloadavg()[0], 2)}

    print(json.dumps(run(None, None, None, False)), flush=True)
    for setting in args.settings:
        clip, batch, lr = setting.split(":")
        for noise in (True, False) if args.no_noise else (True,):
            print(json.dumps(run(float(clip), int(batch), float(lr), noise)), flush=True)


if __name__ == "__main__":
    main()
