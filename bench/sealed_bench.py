"""Load time of registry weights with and without encryption at rest (infra.sealed); prints one JSON line.

The same random tensors (``--mb`` megabytes of float32, in layers of 1 MiB or less) are registered
in two throwaway registries, one plain and one sealed (a KEK file), then
``ModelRegistry.load_state_dict`` is timed ``--runs`` times on each, interleaved (plain, sealed,
plain, ...) so that a busy machine slows both alike. The first load of each is dropped (cold file
cache). ``load_file`` is safetensors' own file loader on the plain file (what the registry called before
encryption existed); ``plain`` and ``sealed`` are ``load_state_dict`` now. Each timing includes reading
every tensor once (a sum), since ``load_file`` maps the file lazily. Reported: median and p90
milliseconds, the ratio of sealed to load_file medians, the load average before
and after (on a shared machine, say so when quoting the figures).

Usage: ``python bench/sealed_bench.py [--mb 1 16 64] [--runs 30]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from infra.registry import ModelRegistry


def _tensors(mb: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    total, out, i = int(mb * 2**20 / 4), {}, 0
    while total > 0:
        n = min(total, 2**18)
        out[f"layer{i}.weight"] = torch.randn(n, generator=g)
        total, i = total - n, i + 1
    return out


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered), 3),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 3)}


def bench(mb: float, runs: int, root: Path) -> dict[str, object]:
    tensors = _tensors(mb)
    kek = root / "kek.hex"
    kek.write_text(os.urandom(32).hex())
    refs = {}
    for mode in ("plain", "sealed"):
        if mode == "sealed":
            os.environ["INDUSFLOW_REGISTRY_KEY"] = f"file:{kek}"
        else:
            os.environ.pop("INDUSFLOW_REGISTRY_KEY", None)
        registry = ModelRegistry(root / f"{mode}-{mb}")
        refs[mode] = (registry, registry.register("m", tensors, params={}, metrics={"x": 0.0}, primary_metric="x"))
    loaders = {"load_file": lambda: load_file(str(refs["plain"][1].weights_path)),
               "plain": lambda: refs["plain"][0].load_state_dict(refs["plain"][1]),
               "sealed": lambda: refs["sealed"][0].load_state_dict(refs["sealed"][1])}
    times: dict[str, list[float]] = {mode: [] for mode in loaders}
    os.environ["INDUSFLOW_REGISTRY_KEY"] = f"file:{kek}"  # a plain version loads the same with the key set
    for i in range(runs + 1):
        for mode, load in loaders.items():
            start = time.perf_counter()
            state = load()
            for tensor in state.values():  # read every weight once: load_file maps the file lazily
                tensor.sum()
            elapsed = (time.perf_counter() - start) * 1000
            if i:
                times[mode].append(elapsed)
            assert torch.equal(state["layer0.weight"], tensors["layer0.weight"])
    stats = {mode: _ms(t) for mode, t in times.items()}
    return {"mb": mb, "file_bytes": {m: r.weights_path.stat().st_size for m, (_, r) in refs.items()}, **stats,
            "ratio_sealed_to_load_file": round(stats["sealed"]["median_ms"] / stats["load_file"]["median_ms"], 2),
            "extra_median_ms": round(stats["sealed"]["median_ms"] - stats["load_file"]["median_ms"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[0.1, 16.0, 64.0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(mb, args.runs, Path(tmp)) for mb in args.mb]
    print(json.dumps({"bench": "sealed-load", "runs": args.runs, "results": rows,
                      "loadavg_before": [round(x, 2) for x in before],
                      "loadavg_after": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
