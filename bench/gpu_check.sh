#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one short run; prints one JSON line (and writes it to
# $OUT/gpu_check.json when OUT names a folder):
#   - bf16-mixed vs fp32 training of the fraud and sensor models: time and validation metric
#     (bench/precision_bench.py);
#   - the `gpu` tests (mixed precision and ddp through tasks.train: tests/unit/test_train_gpu.py);
#   - the serve bench (bench/serve_bench.py --quick) on the GPU machine (the server loads its models
#     on the CPU today: flows/serve places none on CUDA, so this is that machine's CPU serving).
# Without a GPU it stops at once with exit status 2 and says so.
#
# Usage: bench/gpu_check.sh            (PY=path/to/python to use another interpreter than .venv's)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
if [[ ! -x "$PY" ]]; then
  echo "gpu_check: no Python at $PY (make install, or PY=path/to/python bench/gpu_check.sh)" >&2
  exit 2
fi
if ! gpu=$("$PY" -c 'import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA GPU")
print(torch.cuda.get_device_name(0))' 2>&1); then
  echo "gpu_check: needs a CUDA GPU: $gpu; run it on a GPU machine" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export INDUSFLOW_HOME="$work/home"

step() {  # step NAME COMMAND...: runs it, its output to $work/NAME.log, its exit status to $work/NAME.rc
  local name=$1
  shift
  local started=$SECONDS rc=0
  "$@" >"$work/$name.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - started))" >"$work/$name.rc"
  echo "gpu_check: $name exit $rc after $((SECONDS - started)) s" >&2
}

step precision "$PY" bench/precision_bench.py --accelerator cuda
step gpu_tests "$PY" -m pytest -q -m gpu tests/unit/test_train_gpu.py -p no:cacheprovider
step serve "$PY" bench/serve_bench.py --quick

GPU_NAME=$gpu WORK=$work "$PY" - <<'EOF' | tee "$work/gpu_check.json"
import json, os, re
from pathlib import Path

work = Path(os.environ["WORK"])


def step(name):
    rc, seconds = (work / f"{name}.rc").read_text().split()
    log = (work / f"{name}.log").read_text()
    out = {"exit": int(rc), "seconds": int(seconds)}
    last = [line for line in log.splitlines() if line.startswith("{")]
    if last:
        out["result"] = json.loads(last[-1])
    elif int(rc):
        out["log_tail"] = log[-2000:]
    return out


tests = step("gpu_tests")
summary = re.findall(r"(\d+) (passed|failed|skipped|error)", (work / "gpu_tests.log").read_text())
tests["counts"] = {kind: int(n) for n, kind in summary}
print(json.dumps({"check": "gpu", "device": os.environ["GPU_NAME"], "precision": step("precision"),
                  "gpu_tests": tests, "serve": step("serve")}))
EOF
if [[ -n "${OUT:-}" && -d "$OUT" ]]; then
  cp "$work/gpu_check.json" "$OUT/gpu_check.json"
  cp "$work"/*.log "$OUT/"
fi
