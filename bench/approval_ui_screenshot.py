"""Screenshots of a champion move waiting for approval in the Prefect UI, decided in the UI's form.
Prints one JSON line.

Starts a Prefect server (``python -m infra.prefect_server``, what ``make ui`` runs) on a throwaway
home, runs ``python -m flows.fraud train --candidates baseline`` against it with
``INDUSFLOW_GOVERNANCE_APPROVAL_REQUIRED='["fraud-seq"]'`` (the first champion of a fresh home needs
the approval too), and drives Debian's headless Chromium through Playwright as a validator would:
open the paused run, press *Resume*, read the approval form (comparison, model card, lineage),
fill it in as a different person and submit it; then open the promotion artifact. Writes
``bench/results/approval_form.png``, ``approval_form_filled.png`` and ``approval_promotion.png``.

Usage: ``python bench/approval_ui_screenshot.py [--out-dir bench/results]``
"""

from __future__ import annotations

import argparse
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

from loadgen import free_port, spawn_server, stop_server  # bench/ is on the path above

MODEL = "fraud-seq"


def _env(home: Path, api: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INDUSFLOW_", "PREFECT_"))}
    return {**env, "INDUSFLOW_HOME": str(home / "indusflow"), "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_API_URL": api, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _waiting(home: Path, timeout_s: float = 600) -> dict:
    folder = home / "indusflow" / "registry" / MODEL / "approvals"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in folder.glob("*.json") if folder.is_dir() else []:
            request = json.loads(path.read_text())
            if request["status"] == "waiting":
                return request
        time.sleep(1)
    raise SystemExit(f"error: no approval request appeared within {timeout_s:.0f} s")


def drive(ui: str, run_id: str, out_dir: Path, approver: str) -> dict[str, str]:
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        raise SystemExit("error: chromium is not installed (apt-get install chromium)")
    shots = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(f"{ui}/runs/flow-run/{run_id}")
            page.get_by_text("Paused").first.wait_for()
            page.get_by_role("button", name="Resume").first.click()
            page.get_by_text("Approve fraud-seq").first.wait_for()
            page.wait_for_timeout(1000)
            shots["form"] = str(out_dir / "approval_form.png")
            page.screenshot(path=shots["form"], full_page=True)
            dialog = page.get_by_role("dialog")
            fields = dialog.locator("textarea, input[type=text]")  # the form's fields: reason, approver
            fields.nth(0).fill("Card, comparison with the champion and lineage reviewed")
            fields.nth(1).fill(approver)
            control = dialog.locator(".p-select-button__control").first  # the decision: Prefect's own select
            control.focus()
            control.press("Space")  # opens its options (a click in the modal does not, headless)
            page.locator(".p-select-option", has_text="approve").first.click()
            page.wait_for_timeout(500)
            shots["filled"] = str(out_dir / "approval_form_filled.png")
            page.screenshot(path=shots["filled"], full_page=True)
            dialog.get_by_role("button", name="Submit").click()
            page.get_by_text("Completed").first.wait_for(timeout=180_000)
            page.goto(f"{ui}/artifacts/key/{MODEL}-promotion")  # its versions, newest first
            page.get_by_text("approval-gate").first.wait_for()  # its versions, with the task that made each
            href = page.evaluate("""() => {  // the version the approval gate published
                for (const a of document.querySelectorAll("a[href*='/artifacts/artifact/']")) {
                    let el = a;
                    while (el && !(el.innerText || "").includes("Task run")) el = el.parentElement;
                    if (el && el.innerText.includes("approval-gate")) return a.getAttribute("href");
                }
                return null;
            }""")
            if not href:
                raise SystemExit("error: the approval gate published no promotion artifact")
            page.goto(ui + href if href.startswith("/") else href)
            page.get_by_text("promoted to champion").first.wait_for()
            page.get_by_text(approver).first.wait_for()
            page.wait_for_timeout(1000)
            shots["promotion"] = str(out_dir / "approval_promotion.png")
            page.screenshot(path=shots["promotion"], full_page=True)
        finally:
            browser.close()
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results", help="where the screenshots go")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="approval-ui-"))
    port = free_port()
    ui, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"
    env = _env(tmp, api)
    server = train = None
    try:
        server = spawn_server([sys.executable, "-m", "infra.prefect_server", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, cwd=ROOT, log=tmp / "server.log", ready_url=f"{api}/health", timeout_s=180)
        started = time.perf_counter()
        with open(tmp / "train.log", "wb") as log:
            train = subprocess.Popen([sys.executable, "-m", "flows.fraud", "train", "--candidates", "baseline", "--json"],
                                     env={**env, "INDUSFLOW_GOVERNANCE_APPROVAL_REQUIRED": json.dumps([MODEL]),
                                          "INDUSFLOW_GOVERNANCE_ACTOR": "ml-engineer"},
                                     cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        request = _waiting(tmp)
        waited_s = time.perf_counter() - started
        args.out_dir.mkdir(parents=True, exist_ok=True)
        shots = drive(ui, request["run_id"], args.out_dir, approver="validator-anna")
        rc = train.wait(300)
        result = json.loads((tmp / "train.log").read_text().strip().splitlines()[-1])
        promotion = result["promotion"]
        print(json.dumps({"bench": "approval_ui_screenshot", "screenshots": shots, "train_rc": rc,
                          "seconds_to_pause": round(waited_s, 1), "promoted": promotion["promoted"],
                          "approved_by": (promotion.get("approval") or {}).get("decided_by"),
                          "reason": promotion["reason"], "load_avg_1m": round(load, 2)}))
    finally:
        if train is not None and train.poll() is None:
            train.kill()
        if server is not None:
            stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
