"""Screenshots of a champion move waiting for approval in the Prefect UI, decided in the UI's form.
Prints one JSON line.

Starts a Prefect server (``python -m infra.prefect_server``, what ``make ui`` runs) on a throwaway
home and, against it: trains ``fraud-seq`` twice on small synthetic data (``python -m flows.fraud
train --candidates baseline``: v1 champion, v2 registered), makes two approvers' signing keys (``flows.registry keygen
alice|bob``, kept outside the home) and a policy enrolling them (alice is this OS account: she
starts the runs), then promotes the version that is not champion by hand (``flows.fraud promote
--model fraud-seq:N``), which pauses for a signed decision. bob signs it (``flows.registry sign RUN --key bob.pem``), and headless Chromium,
driven through Playwright as a validator would, opens the paused run, presses *Resume*, reads the
approval form (comparison, model card, lineage), pastes the signed decision into its one field and
submits it; then opens the promotion artifact, which names bob. Writes
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

from headless import chromium_page
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


def _cli(env: dict[str, str], *args: str) -> dict:
    """``python -m <args> --json``: the typed result on the last line of stdout (exits on failure)."""
    done = subprocess.run([sys.executable, "-m", *args, "--json"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(args[:2])} exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def enrol(env: dict[str, str], keys: Path) -> Path:
    """alice (this OS account) and bob enrolled as approvers of the model; returns bob's key path."""
    from infra.registry import current_actor

    public = {p: _cli(env, "flows.registry", "keygen", p, "--out", str(keys / f"{p}.pem"))["public_key"]
              for p in ("alice", "bob")}
    _cli(env, "flows.registry", "policy", "--model", MODEL, "--key", str(keys / "alice.pem"), "--approvers",
         f"alice:{public['alice']}:{current_actor()}", f"bob:{public['bob']}")
    return keys / "bob.pem"


def drive(ui: str, run_id: str, out_dir: Path, signed: str, approver: str) -> dict[str, str]:
    shots = {}
    with chromium_page(1400, 1000) as page:
        page.goto(f"{ui}/runs/flow-run/{run_id}")
        page.get_by_text("Paused").first.wait_for()
        page.get_by_role("button", name="Resume").first.click()
        page.get_by_text("Approve fraud-seq").first.wait_for()
        page.wait_for_timeout(1000)
        shots["form"] = str(out_dir / "approval_form.png")
        page.screenshot(path=shots["form"], full_page=True)
        dialog = page.get_by_role("dialog")
        # the form's first field is the signed decision (the second, "via", is the API's)
        dialog.locator("textarea, input[type=text]").first.fill(signed)
        page.wait_for_timeout(500)
        shots["filled"] = str(out_dir / "approval_form_filled.png")
        page.screenshot(path=shots["filled"], full_page=True)
        dialog.get_by_role("button", name="Submit").click()
        page.get_by_text("Completed").first.wait_for(timeout=180_000)
        page.goto(f"{ui}/artifacts/key/{MODEL}-promotion")  # its versions, newest first: the approval gate's
        link = page.locator("a[href*='/artifacts/artifact/']").first
        link.wait_for()
        href = link.get_attribute("href") or ""
        page.goto(ui + href if href.startswith("/") else href)
        page.get_by_text("promoted to champion").first.wait_for()
        page.get_by_text(approver).first.wait_for()
        page.wait_for_timeout(1000)
        shots["promotion"] = str(out_dir / "approval_promotion.png")
        page.screenshot(path=shots["promotion"], full_page=True)
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
        for seed in ("7", "8"):  # v1 becomes champion (no policy yet), v2 is registered (small data: minutes)
            _cli(env, "flows.fraud", "train", "--candidates", "baseline", "--n-accounts", "300", "--n-terminals", "100",
                 "--seed", seed)
        bob = enrol(env, tmp / "keys")
        aliases = json.loads((tmp / "indusflow" / "registry" / MODEL / "aliases.json").read_text())
        other = 1 if aliases["champion"] == 2 else 2  # v2 may have won the champion rule: promote the other
        started = time.perf_counter()
        with open(tmp / "train.log", "wb") as log:
            train = subprocess.Popen([sys.executable, "-m", "flows.fraud", "promote", "--model", f"{MODEL}:{other}",
                                      "--json"], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        request = _waiting(tmp)
        waited_s = time.perf_counter() - started
        signed = _cli(env, "flows.registry", "sign", request["run_id"], "--key", str(bob), "--reason",
                      "Card, comparison with the champion and lineage reviewed")
        args.out_dir.mkdir(parents=True, exist_ok=True)
        shots = drive(ui, request["run_id"], args.out_dir, json.dumps(signed), approver="bob")
        rc = train.wait(300)
        promotion = json.loads((tmp / "train.log").read_text().strip().splitlines()[-1])
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
