"""A screenshot of a fraud training run's Logs tab in the Prefect UI: its epochs and metrics are there.
Prints one JSON line.

Starts a Prefect server (``python -m infra.prefect_server``, what ``make ui`` runs) on 127.0.0.1 and a
throwaway home, runs a tiny fraud training against it (``python -m flows.fraud train`` on the
project's synthetic generator: 300 accounts, 40 days, 2 epochs), then headless Chromium, driven
through Playwright, opens the flow run's page, clicks *Logs* and waits for the epoch lines the
project's loggers sent (``epoch 2/2 ...; train/loss=... val/ap=...``). Writes
``bench/results/prefect_logs_tab_<date>.png``. The server is stopped and the home removed after.

Usage: ``python bench/prefect_logs_screenshot.py [--out PATH]`` (needs ``chromium`` on the PATH and
the ``dev`` extra's Playwright; ``PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1``: no browser is downloaded).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headless import chromium_page
from loadgen import free_port, spawn_server, stop_server  # bench/ is on the path above

TINY = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--max-epochs", "2", "--seq-len", "8"]
FLOW = "fraud-train"


def _env(home: Path, api: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INDUSFLOW_", "PREFECT_"))}
    return {**env, "INDUSFLOW_HOME": str(home / "indusflow"), "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_API_URL": api, "PREFECT_UI_API_URL": api, "PYTHONPATH": str(ROOT),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def train(env: dict[str, str]) -> dict:
    """``python -m flows.fraud train --json`` on tiny synthetic data: its typed result (exits on failure)."""
    done = subprocess.run([sys.executable, "-m", "flows.fraud", "train", *TINY, "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"error: fraud train exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def latest_run_id(api: str) -> str:
    """The id of the last ``fraud-train`` flow run, read from the server's REST API."""
    import httpx

    body = {"flows": {"name": {"any_": [FLOW]}}, "sort": "START_TIME_DESC", "limit": 1}
    runs = httpx.post(f"{api}/flow_runs/filter", json=body, timeout=30).raise_for_status().json()
    if not runs:
        raise SystemExit(f"error: the server holds no {FLOW} flow run")
    return runs[0]["id"]


def shoot(ui: str, run_id: str, out: Path) -> list[str]:
    """Open the run's Logs tab, wait for its epoch lines, save the screenshot; returns the epoch lines seen."""
    # the log list scrolls inside the page: a tall window shows all of a tiny run's ~45 lines
    with chromium_page(1600, 3400) as page:
        page.goto(f"{ui}/runs/flow-run/{run_id}")
        page.get_by_text("Logs", exact=True).first.click()  # the tab (the default one, clicked all the same)
        page.get_by_text("epoch 2/2").first.wait_for()
        page.get_by_text("sequence/test: n=").first.wait_for()
        page.wait_for_timeout(1500)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True)
        return [line.strip() for line in page.get_by_text("s/epoch").all_inner_texts()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    today = dt.date.today().isoformat()
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"prefect_logs_tab_{today}.png",
                        help="where the screenshot goes")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="prefect-logs-"))
    port = free_port()
    ui, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"
    env = _env(tmp, api)
    server = None
    try:
        server = spawn_server([sys.executable, "-m", "infra.prefect_server", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, cwd=ROOT, log=tmp / "server.log", ready_url=f"{api}/health", timeout_s=180)
        started = time.perf_counter()
        result = train(env)
        train_s = time.perf_counter() - started
        run_id = latest_run_id(api)
        lines = shoot(ui, run_id, args.out)
        print(json.dumps({"bench": "prefect_logs_screenshot", "screenshot": str(args.out), "flow_run_id": run_id,
                          "epoch_lines": lines, "train_seconds": round(train_s, 1), "winner": result.get("winner"),
                          "load_avg_1m": round(load, 2)}))
    finally:
        if server is not None:
            stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
