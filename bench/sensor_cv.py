"""Engine-split cross-validation of the sensor RUL models on a C-MAPSS training file.

Each fold holds out a fifth of the engines (never windows), cuts each held-out engine
before failure at random points as a C-MAPSS test file is, and scores the last window of
every cut: RMSE and the PHM08 score of the 1D-CNN fine-tuned from a masked-reconstruction
encoder (pre-trained on the fold's training engines' readings, no labels), the same CNN
trained from scratch, the gradient-boosting baseline and the ensemble (mean of the
pre-trained CNN and the GBM). The CNN is built and trained as ``sensor-train`` builds and
trains it (same config, the same generic train / fine-tune functions). Validation engines
come from each fold's training engines; the normaliser is fitted on those only.

With two seeds or more, each fold also scores the mean of its seeds' CNNs
(``*_seed_mean``): with seeds 0 1 2 that is the flow's default CNN candidate, a seed
ensemble of ``FinetuneConfig.members`` = 3 CNNs, and ``ensemble_seed_mean`` is its mean with
the GBM.

``--arch cnn tcn transformer`` trains each encoder trunk (``ModelConfig.arch``) alike, as
``<arch>_pretrained`` / ``<arch>_scratch`` rows (``cnn_*`` as before); the ensemble row is
the first arch's CNN with the GBM. With two trunks or more, ``mean(a+b+...)`` rows score the mean
of every combination of two or more of a seed's models (trunks and the GBM), from the saved
predictions: what averaging unlike trunks gains over the CNN + GBM pair.

``--cross-fit K`` trains each fold as ``sensor-train`` does by default (``FinetuneConfig.cross_fit``):
K CNNs (seeds 0..K-1) and K GBMs, member i validating on its own disjoint block of validation
engines and training on the others; the candidates are the members' means and their stack (weights
fitted on the pooled out-of-fold predictions, ``xfit_stack``), and the choice pools every block's
out-of-fold predictions (rows ``xfit_*``; ``xfit_registered`` is what the flow registers).
``estimate_check`` in the JSON compares, per protocol, the chosen candidate's validation RMSE (the
estimate) with its RMSE on the held-out engines, fold by fold.

Prints a markdown table (mean ± std (min–max) over folds x seeds) and one JSON line;
writes the validation curves (PNG) and the JSON beside them in ``--out-dir``.

Usage (FD001, 5 folds x 3 seeds; a few minutes per fold on one core)::

    nice -n 10 python bench/sensor_cv.py --cmapss-dir ../shared/data/cmapss --subset FD001 \\
        --folds 5 --seeds 0 1 2 --out-dir bench/results
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def seed_means(preds_file: Path, fold_data: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per fold and CNN variant run with two seeds or more: the scores of the mean of
    its seeds' predictions (the seed-averaged CNN) and, for the ensemble's CNN, of that mean
    with the GBM. ``fold_data(fold)`` gives a fold's windows (their truth)."""
    import numpy as np

    from solutions.sensor import crossval as CV

    done = {(r["fold"], r["seed"]) for r in rows if r["model"] == "ensemble"}
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for line in preds_file.read_text().splitlines():
        record = json.loads(line)
        if (record["fold"], record["seed"]) in done:
            runs.setdefault((record["fold"], record["model"]), []).append(record)
    out = []
    for (fold, variant), members in sorted(runs.items()):
        if variant == "gbm" or len(members) < 2:
            continue
        data = fold_data(fold)
        last = np.mean([m["last"] for m in members], axis=0)
        every = np.mean([m["every"] for m in members], axis=0)
        base = {"fold": fold, "seed": -1, "seeds": sorted(m["seed"] for m in members),
                "test_engines": next(r["test_engines"] for r in rows if r["fold"] == fold)}
        out.append({**base, "model": f"{variant}_seed_mean", **CV.rul_scores(data, last, every)})
        ensemble_cnn = "cnn_pretrained" if (fold, "cnn_pretrained") in runs else "cnn_scratch"
        if variant == ensemble_cnn and (fold, "gbm") in runs:
            gbm = runs[(fold, "gbm")][0]
            out.append({**base, "model": "ensemble_seed_mean", **CV.rul_scores(
                data, CV.ensemble(last, gbm["last"]), CV.ensemble(every, gbm["every"]))})
            if all("val" in m for m in [*members, gbm]):
                out.append({**base, **registered(data, members, gbm)})
    return out


def registered(data: Any, members: list[dict[str, Any]], gbm: dict[str, Any]) -> dict[str, Any]:
    """The ``registered`` row of one fold: the candidate ``sensor-train`` registers (the seed
    ensemble of ``members`` CNNs, the GBM or their mean, whichever scores the lowest RUL RMSE
    on the fold's validation windows) scored on the held-out engines, with its name."""
    import numpy as np

    from solutions.sensor import candidates as CA
    from solutions.sensor import crossval as CV

    cnn = {k: np.mean([m[k] for m in members], axis=0) for k in ("last", "every", "val")}
    choice = CA.choose_on_validation(data.rul_val.rul, cnn["val"], np.asarray(gbm["val"]))
    pick = {CA.CNN: (cnn["last"], cnn["every"]), CA.BASELINE: (np.asarray(gbm["last"]), np.asarray(gbm["every"])),
            CA.ENSEMBLE: (CV.ensemble(cnn["last"], gbm["last"]), CV.ensemble(cnn["every"], gbm["every"]))}
    last, every = pick[choice.winner]
    return {"model": "registered", "chosen": choice.winner, "val_estimate": round(choice.val_rmse[choice.winner], 3),
            "val_rmse": {k: round(v, 3) for k, v in choice.val_rmse.items()}, **CV.rul_scores(data, last, every)}


def cross_fit_rows(fold: int, members: list[dict[str, Any]], base: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one cross-fitted fold. ``members[i]``: member ``i``'s data (its own validation
    block), CNN and GBM predictions (``cnn``/``gbm``: last, every, val). The CNN candidate is the
    mean of the members' CNNs, the GBM candidate the mean of their GBMs; the choice between them and
    their mean pools every member's out-of-fold validation predictions (each block scored by the
    models that did not train on it), as ``registered`` does on one block."""
    import numpy as np

    from solutions.sensor import candidates as CA
    from solutions.sensor import crossval as CV

    data = members[0]["data"]
    for m in members[1:]:  # one normaliser (train + validation assets are the same set) and the same cuts
        assert np.array_equal(m["data"].test_last.rul, data.test_last.rul)
    truth = np.concatenate([m["data"].rul_val.rul for m in members])
    cnn_val = np.concatenate([m["cnn"][2] for m in members])
    gbm_val = np.concatenate([m["gbm"][2] for m in members])
    block = np.concatenate([np.full(len(m["data"].rul_val.rul), i) for i, m in enumerate(members)])
    choice = CA.choose_on_validation(truth, cnn_val, gbm_val, block=block)
    cnn = [CV.ensemble(*(m["cnn"][j] for m in members)) for j in (0, 1)]
    gbm = [CV.ensemble(*(m["gbm"][j] for m in members)) for j in (0, 1)]
    mean = [CV.ensemble(cnn[j], gbm[j]) for j in (0, 1)]
    w = choice.stack or {CA.CNN: 0.5, CA.BASELINE: 0.5}  # the stack's weights, fitted out of fold
    stack = [w[CA.CNN] * cnn[j] + w[CA.BASELINE] * gbm[j] for j in (0, 1)]
    pick = {CA.CNN: cnn, CA.BASELINE: gbm, CA.ENSEMBLE: mean, CA.STACK: stack}[choice.winner]
    engines = sorted({str(a).split("@")[0] for m in members for a in m["data"].rul_val.asset})  # cuts: <asset>@<k>
    return [{**base, "model": "xfit_cnn_mean", **CV.rul_scores(data, *cnn)},
            {**base, "model": "xfit_gbm_mean", **CV.rul_scores(data, *gbm)},
            {**base, "model": "xfit_ensemble", **CV.rul_scores(data, *mean)},
            {**base, "model": "xfit_stack", "weights": w, **CV.rul_scores(data, *stack)},
            {**base, "model": "xfit_registered", "chosen": choice.winner, "val_engines": len(engines),
             "val_estimate": round(choice.val_rmse[choice.winner], 3),
             "val_rmse": {k: round(v, 3) for k, v in choice.val_rmse.items()}, **CV.rul_scores(data, *pick)}]


def estimate_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per protocol (rows with a ``val_estimate``): does the validation estimate predict the held-out
    engines' RMSE? Mean estimate and mean held-out RMSE over folds, and the per-fold error of the
    estimate (held-out minus estimate): its mean, spread and largest miss."""
    import numpy as np

    out = {}
    for name in sorted({r["model"] for r in rows if "val_estimate" in r}):
        pairs = [(r["val_estimate"], r["rmse"]) for r in rows if r["model"] == name and "val_estimate" in r]
        est, test = np.array(pairs).T
        diff = test - est
        out[name] = {"folds": len(pairs), "estimate_mean": round(float(est.mean()), 3),
                     "estimate_sd": round(float(est.std(ddof=1)), 3) if len(pairs) > 1 else None,
                     "heldout_mean": round(float(test.mean()), 3),
                     "heldout_sd": round(float(test.std(ddof=1)), 3) if len(pairs) > 1 else None,
                     "error_mean": round(float(diff.mean()), 3),
                     "error_sd": round(float(diff.std(ddof=1)), 3) if len(pairs) > 1 else None,
                     "error_max_abs": round(float(np.abs(diff).max()), 3),
                     "chosen": {c: sum(r.get("chosen") == c for r in rows if r["model"] == name)
                                for c in sorted({r.get("chosen") for r in rows if r["model"] == name})}}
    return out


def trunk_means(preds_file: Path, fold_data: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per fold, seed and combination of two or more of its models (``gbm`` and every
    ``<arch>_<kind>`` variant) when the seed trained more than one trunk: the scores of their
    mean prediction, named ``mean(a+b+...)``."""
    import itertools

    from solutions.sensor import crossval as CV

    done = {(r["fold"], r["seed"]) for r in rows if r["model"] == "ensemble"}
    runs: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for line in preds_file.read_text().splitlines():
        record = json.loads(line)
        if (record["fold"], record["seed"]) in done:
            runs.setdefault((record["fold"], record["seed"]), {})[record["model"]] = record
    out = []
    for (fold, seed), models in sorted(runs.items()):
        if len({name.split("_")[0] for name in models if name != "gbm"}) < 2:
            continue
        data = fold_data(fold)
        base = {"fold": fold, "seed": seed, "test_engines": next(r["test_engines"] for r in rows if r["fold"] == fold)}
        for k in range(2, len(models) + 1):
            for combo in itertools.combinations(sorted(models), k):
                last = CV.ensemble(*(models[m]["last"] for m in combo))
                every = CV.ensemble(*(models[m]["every"] for m in combo))
                out.append({**base, "model": f"mean({'+'.join(combo)})", **CV.rul_scores(data, last, every)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmapss-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/cmapss"))
    parser.add_argument("--subset", default="FD001")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--split-seed", type=int, default=0, help="Seed of the engine folds.")
    parser.add_argument("--max-epochs", type=int, default=None, help="Override the config's fine-tuning epochs.")
    parser.add_argument("--patience", type=int, default=None, help="Override the fine-tuning early-stopping patience.")
    parser.add_argument("--pretrain-epochs", type=int, default=None, help="Override the config's pre-training epochs.")
    parser.add_argument("--channels", type=int, default=None, help="Override the encoder's first conv width.")
    parser.add_argument("--dropout", type=float, default=None, help="Override the encoder's and heads' dropout.")
    parser.add_argument("--arch", nargs="+", default=["cnn"], choices=["cnn", "tcn", "transformer"],
                        help="Encoder trunks to train, each alike (ModelConfig.arch).")
    parser.add_argument("--stride", type=int, default=None, help="Override the training window stride.")
    parser.add_argument("--length", type=int, default=None, help="Override the window length.")
    parser.add_argument("--val-cuts", type=int, default=None,
                        help="Override WindowConfig.val_cuts: RUL validation (early stopping, the registered "
                        "candidate) on the last window of N random cuts per validation engine (0: every window).")
    parser.add_argument("--pad-from", type=int, default=None,
                        help="Override the row the padded training windows start from (0: no padded windows).")
    parser.add_argument("--cross-fit", type=int, default=0, metavar="K",
                        help="Cross-fit each fold instead of one split per seed: K CNNs (seeds 0..K-1) and K GBMs, "
                        "member i validating (early stopping, the choice) on its own disjoint block of validation "
                        "engines; the candidates are the members' means (rows xfit_*).")
    parser.add_argument("--train-seed", type=int, default=0, metavar="S",
                        help="With --cross-fit, as sensor train's finetune.seed: member k trains from seed S + k, the "
                        "encoder pre-trains from seed S, the GBMs fit with random state fold + S (0: the runs before "
                        "this option). One S per --out-dir; seeds S = 0, K, 2K, ... share no member seed.")
    parser.add_argument("--only-folds", type=int, nargs="*", default=None, help="Run only these fold indices.")
    parser.add_argument("--resume", action="store_true", help="Keep the runs already in --out-dir, run the rest.")
    parser.add_argument("--summarize-only", action="store_true", help="Only summarise the runs in --out-dir.")
    parser.add_argument("--no-pretrained", action="store_true", help="Skip the pre-trained CNN (and the ensemble).")
    parser.add_argument("--budget-s", type=float, default=None, help="Start no new fold after this many seconds.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    from bench.sensor_runs import bench_environment

    bench_environment(args.threads)
    import numpy as np

    from bench.sensor_runs import plot_curves, pretrain_encoder, train_cnn
    from solutions.sensor import crossval as CV
    from solutions.sensor import evaluate as E
    from solutions.sensor import schema as S
    from solutions.sensor.cmapss import load_cmapss
    from solutions.sensor.config import SensorConfig, SensorSource
    from solutions.sensor.data import window_config

    started = time.perf_counter()
    cfg = SensorConfig()
    if args.max_epochs:
        cfg = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"max_epochs": args.max_epochs})})
    if args.patience:
        cfg = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"patience": args.patience})})
    if args.pretrain_epochs:
        cfg = cfg.model_copy(update={"pretrain": cfg.pretrain.model_copy(update={"max_epochs": args.pretrain_epochs})})
    if args.channels:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"channels": args.channels})})
    if args.dropout is not None:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dropout": args.dropout})})
    if args.train_seed:
        cfg = cfg.model_copy(update={"pretrain": cfg.pretrain.model_copy(update={"seed": args.train_seed})})
    ft, pcfg = cfg.finetune, cfg.pretrain
    wcfg = window_config(SensorSource(cmapss_dir=args.cmapss_dir, subset=args.subset), cfg)
    if args.stride:
        wcfg = wcfg.model_copy(update={"stride": args.stride})
    if args.length:
        wcfg = wcfg.model_copy(update={"length": args.length})
    if args.val_cuts is not None:
        wcfg = wcfg.model_copy(update={"val_cuts": args.val_cuts})
    if args.pad_from is not None:
        wcfg = wcfg.model_copy(update={"pad_from": args.pad_from or None})
    grid, _ = load_cmapss(Path(args.cmapss_dir), args.subset)
    grid = grid.loc[grid[S.SET] != "test"]  # the training file's engines only; test units stay unseen
    assets = CV.training_assets(grid)
    folds = CV.engine_folds(assets, args.folds, args.split_seed)
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="sensor-cv-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_file, curves_file = out_dir / "sensor_cv_runs.jsonl", out_dir / "sensor_cv_curves.jsonl"
    preds_file = out_dir / "sensor_cv_predictions.jsonl"
    if not (args.resume or args.summarize_only):
        for stale in (runs_file, curves_file, preds_file):
            stale.unlink(missing_ok=True)
    rows = [json.loads(line) for line in runs_file.read_text().splitlines()] if runs_file.exists() else []
    curves = [json.loads(line) for line in curves_file.read_text().splitlines()] if curves_file.exists() else []
    done = {(r["fold"], r["seed"]) for r in rows if r["model"] == "ensemble"}
    rows = [r for r in rows if (r["fold"], r["seed"]) in done]  # a seed cut short is run again whole
    curves = [c for c in curves if (c["fold"], c["seed"]) in done]

    def keep(record: dict[str, Any], target: Path) -> None:
        with open(target, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    runs_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curves_file.write_text("".join(json.dumps(c) + "\n" for c in curves))
    prepared: dict[int, tuple[Any, ...]] = {}
    arch_cfgs = {a: cfg.model_copy(update={"model": cfg.model.model_copy(update={"arch": a})}) for a in args.arch}

    def fold_inputs(fold: int) -> tuple[Any, ...]:
        """The fold's data, GBM predictions and pre-trained encoder per arch (built once per fold)."""
        if fold not in prepared:
            splits = CV.fold_splits(assets, folds[fold], cfg.split.val_fraction, seed=fold)
            fd = CV.fold_data(grid, splits, cfg, wcfg, seed=fold)
            gbm = E.fit_baseline(fd.data.train, fold)
            gbm_pred = tuple(gbm.predict_rul(part.x, part.end_step)
                             for part in (fd.data.test_last, fd.data.test_all, fd.data.rul_val))
            # pre-training sees the readings of the fold's training and validation engines, no labels
            encoders = {a: None if args.no_pretrained else pretrain_encoder(
                grid, splits, fd.normalizer, arch_cfgs[a], wcfg, f"cv-pre-{fold}" + ("" if a == "cnn" else f"-{a}"))
                for a in args.arch}
            prepared[fold] = (fd, gbm_pred, encoders)
        return prepared[fold]

    for fold in range(len(folds)) if args.cross_fit and not args.summarize_only else []:
        if (args.only_folds is not None and fold not in args.only_folds) or (fold, -1) in done:
            continue
        if args.budget_s and time.perf_counter() - started > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: fold {fold} and later not run", file=sys.stderr)
            break
        t_fold = time.perf_counter()
        first = args.arch[0]
        members, fresh = [], []
        base = {"fold": fold, "test_engines": len(folds[fold])}
        encoder = None
        for k, sp in enumerate(CV.cross_fit_splits(assets, folds[fold], cfg.split.val_fraction, args.cross_fit,
                                                   seed=fold)):
            fd = CV.fold_data(grid, sp, cfg, wcfg, seed=fold)
            if encoder is None and not args.no_pretrained:  # every member's train + validation engines: one encoder
                encoder = pretrain_encoder(grid, sp, fd.normalizer, arch_cfgs[first], wcfg, f"cv-xfit-pre-{fold}")
            gbm = E.fit_baseline(fd.data.train, fold + args.train_seed)
            g = tuple(gbm.predict_rul(part.x, part.end_step) for part in (fd.data.test_last, fd.data.test_all, fd.data.rul_val))
            seed = args.train_seed + k
            run = train_cnn(fd.data, len(fd.normalizer.channels_), arch_cfgs[first], wcfg, seed,
                            f"cv-xfit-{fold}-{seed}", encoder)
            members.append({"data": fd.data, "cnn": (run.last, run.every, run.val), "gbm": g})
            # each member's predictions and the truth they are scored on, for post-hoc analysis
            keep({"fold": fold, "seed": seed, "variant": "xfit", "truth_last": fd.data.test_last.rul.tolist(),
                  "truth_val": fd.data.rul_val.rul.tolist(), "last": np.round(run.last, 3).tolist(),
                  "val": np.round(run.val, 3).tolist(), "gbm_last": np.round(g[0], 3).tolist(),
                  "gbm_val": np.round(g[2], 3).tolist(), "test_units": [str(a) for a in fd.data.test_last.asset],
                  # every window of the held-out engines (stride 1): a cut's earlier windows, for
                  # analyses that combine a unit's last few windows
                  "last_end_step": fd.data.test_last.end_step.tolist(), "every": np.round(run.every, 3).tolist(),
                  "gbm_every": np.round(g[1], 3).tolist(), "every_asset": [str(a) for a in fd.data.test_all.asset],
                  "every_end_step": fd.data.test_all.end_step.tolist()},
                 preds_file)
            fresh += [{**base, "seed": seed, "model": "xfit_member_cnn", **CV.rul_scores(fd.data, run.last, run.every),
                       "epochs": len(run.val_rmse), "best_epoch": run.best_epoch, "seconds": run.seconds},
                      {**base, "seed": seed, "model": "xfit_member_gbm", **CV.rul_scores(fd.data, g[0], g[1])}]
            curve = {"fold": fold, "seed": seed, "model": "xfit_member_cnn", "val_rmse": run.val_rmse,
                     "best_epoch": run.best_epoch}
            curves.append(curve)
            keep(curve, curves_file)
            print(json.dumps(fresh[-2]), file=sys.stderr, flush=True)
        fresh += [{**r, "seed": -1} for r in cross_fit_rows(fold, members, base)]
        fresh.append({**base, "seed": -1, "model": "ensemble", "note": "marks the fold done (--resume)",
                      **{k: v for k, v in fresh[-2].items() if k in ("rmse", "phm08", "rmse_all_windows")}})
        for row in fresh:
            keep(row, runs_file)
        rows.extend(fresh)
        done.add((fold, -1))
        print(json.dumps(fresh[-2]), file=sys.stderr, flush=True)
        print(f"fold {fold} cross-fitted: {time.perf_counter() - t_fold:.0f} s", file=sys.stderr, flush=True)

    # seed by seed: every fold gets its first seed before any gets its second
    for seed in [] if args.summarize_only or args.cross_fit else args.seeds:
        for fold in range(len(folds)):
            if (args.only_folds is not None and fold not in args.only_folds) or (fold, seed) in done:
                continue
            if args.budget_s and time.perf_counter() - started > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: seed {seed} fold {fold} and later not run", file=sys.stderr)
                break
            t_fold = time.perf_counter()
            fd, (gbm_last, gbm_all, gbm_val), encoders = fold_inputs(fold)
            data, n_ch = fd.data, len(fd.normalizer.channels_)
            base = {"fold": fold, "seed": seed, "test_engines": len(folds[fold])}
            fresh = [{**base, "model": "gbm", **CV.rul_scores(data, gbm_last, gbm_all)}]
            preds = {}
            runs = [(a, kind) for a in args.arch
                    for kind in (["pretrained"] if encoders[a] is not None else []) + ["scratch"]]
            for arch, kind in runs:
                variant = f"{arch}_{kind}"
                run = train_cnn(data, n_ch, arch_cfgs[arch], wcfg, seed, f"cv-{fold}-{seed}-{variant}",
                                encoders[arch] if kind == "pretrained" else None)
                preds[variant] = (run.last, run.every, run.val)
                fresh.append({**base, "model": variant, **CV.rul_scores(data, run.last, run.every),
                              "epochs": len(run.val_rmse), "best_epoch": run.best_epoch, "seconds": run.seconds})
                curve = {"fold": fold, "seed": seed, "model": variant, "val_rmse": run.val_rmse,
                         "best_epoch": run.best_epoch}
                curves.append(curve)
                keep(curve, curves_file)
                print(json.dumps(fresh[-1]), file=sys.stderr, flush=True)
            for variant, (last, every, val) in ({"gbm": (gbm_last, gbm_all, gbm_val)} | preds).items():
                keep({"fold": fold, "seed": seed, "model": variant, "last": np.round(last, 3).tolist(),
                      "every": np.round(every, 3).tolist(), "val": np.round(val, 3).tolist()}, preds_file)
            first = args.arch[0]
            cnn = preds.get(f"{first}_pretrained", preds[f"{first}_scratch"])
            fresh.append({**base, "model": "ensemble", **CV.rul_scores(
                data, CV.ensemble(cnn[0], gbm_last), CV.ensemble(cnn[1], gbm_all))})
            for row in fresh:  # a seed's rows together, the ensemble last (what --resume looks for)
                keep(row, runs_file)
            rows.extend(fresh)
            done.add((fold, seed))
            print(f"fold {fold} seed {seed}: {time.perf_counter() - t_fold:.0f} s", file=sys.stderr, flush=True)

    metrics = ("rmse", "phm08", "rmse_all_windows")
    rows = [r for r in rows if not r["model"].endswith("_seed_mean") and not r["model"].startswith("mean(")]
    if preds_file.exists() and not args.cross_fit:
        def data_of(fold: int) -> Any:
            if fold in prepared:
                return prepared[fold][0].data
            splits = CV.fold_splits(assets, folds[fold], cfg.split.val_fraction, seed=fold)
            return CV.fold_data(grid, splits, cfg, wcfg, seed=fold).data

        rows += seed_means(preds_file, data_of, rows) + trunk_means(preds_file, data_of, rows)
    if args.cross_fit:
        rows = [r for r in rows if not (r["model"] == "ensemble" and r.get("seed") == -1)]
    summary = CV.summarize(rows, metrics)
    table = CV.render_table(summary, metrics)
    png = plot_curves(curves, ft.smoothing, out_dir / "sensor_cv_val_curves.png") if curves else None
    print(table)
    result = {
        "bench": "sensor_cv", "subset": args.subset, "engines": len(assets), "folds": args.folds,
        "runs_per_fold": {f: sorted(s for ff, s in done if ff == f) for f in sorted({f for f, _ in done})}, "protocol": {
            "test": f"last window of {wcfg.test_cuts} random cuts per held-out engine", "window": wcfg.length,
            "pad_from": wcfg.pad_from, "validation": (f"last window of {wcfg.val_cuts} random cuts per validation "
                                                      "engine" if wcfg.val_cuts else "every validation window"),
            "train_stride": wcfg.stride, "rul_cap": wcfg.rul_cap, "val_fraction": cfg.split.val_fraction},
        "recipe": {"finetune": ft.model_dump(), "model": cfg.model.model_dump(), "pretrain": pcfg.model_dump()},
        "summary": {r["model"]: {m: round(float(r[f"{m}_mean"]), 3) for m in metrics}
                    | {f"{m}_std": CV.finite(r[f"{m}_std"]) for m in metrics} | {"runs": int(r["rmse_count"])}
                    for _, r in summary.iterrows()},
        "estimate_check": estimate_check(rows), "cross_fit": args.cross_fit, "train_seed": args.train_seed,
        "curves_png": str(png) if png else None, "seconds": round(time.perf_counter() - started, 1),
        "runs": rows,
    }
    (out_dir / "sensor_cv.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "sensor_cv.md").write_text(table + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))


if __name__ == "__main__":
    main()
