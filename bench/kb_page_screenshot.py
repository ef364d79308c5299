"""A screenshot of the knowledge-base page with a streamed, cited answer. Prints one JSON line.

Starts the real server command (``python -m flows.serve``, knowledge base only, collections
``legal`` and ``medical``) on a throwaway home, then drives Debian's headless Chromium through
Playwright as a person would: sign in with a key, upload a small maintenance manual, wait until
it is indexed, ask a question whose answer is in it, let the answer stream in (extractive: no
LLM is configured) and open its first citation; then ask what the manual cannot answer. Writes
``bench/results/kb_page.png`` and ``kb_page_unanswered.png``, and prints
the times the page showed: upload to indexed, question to first answer text and to the end of
the stream, with the load average beside them (the machine may be busy).

Usage: ``python bench/kb_page_screenshot.py [--out bench/results/kb_page.png]``
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

DOCUMENT = """<!doctype html>
<html><head><title>P-200 feed pump: maintenance manual</title></head><body>
<h1>P-200 feed pump</h1>
<p>The impeller of the P-200 feed pump must be inspected every 1,500 operating hours, or sooner when the bearing temperature rises above 80 degrees Celsius. Replace the mechanical seal kit when the leakage exceeds five drops per minute at rated pressure.</p>
<p>The maintenance crew records every inspection in the plant logbook with the running hours of the pump. The cooling water circuit is flushed once a year before the summer shutdown.</p>
</body></html>
"""
QUESTION = "How often must the impeller of the P-200 pump be inspected?"
UNANSWERABLE = "What is the recommended dose of amoxicillin for children?"


def start_server(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The API (knowledge base only) on a free port of 127.0.0.1, once it answers."""
    port = free_port()
    env = {**os.environ, "INDUSFLOW_HOME": str(home), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "INDUSFLOW_KB_COLLECTIONS": "legal,medical", "INDUSFLOW_SERVE_FRAUD_MODEL": "",
           "INDUSFLOW_SERVE_SENSOR_MODEL": ""}
    for name in ("INDUSFLOW_LLM_URL", "INDUSFLOW_MILVUS_URI", "INDUSFLOW_SERVE_REDIS_URL"):
        env.pop(name, None)
    url = f"http://127.0.0.1:{port}"
    proc = spawn_server([sys.executable, "-m", "flows.serve", "--port", str(port)], env=env, cwd=ROOT,
                        log=home / "server.log", ready_url=f"{url}/healthz", timeout_s=120)
    return proc, url


def drive(url: str, key: str, document: Path, out: Path) -> dict[str, float | int | str]:
    """The page's whole path in headless Chromium; the screenshot goes to ``out``."""
    with chromium_page(1280, 860) as page:
        page.goto(f"{url}/kb")
        page.fill("#key", key)
        page.click("#signin-form button[type=submit]")
        page.locator("#app").wait_for()
        t0 = time.perf_counter()
        page.set_input_files("#files", str(document))
        page.click("#upload-btn")
        page.locator("#docs tbody tr", has_text=document.name).locator(".st-indexed").wait_for(timeout=180_000)
        indexed_s = time.perf_counter() - t0
        page.evaluate("""() => {
        const answer = document.getElementById("answer");
        window.changes = [];
        new MutationObserver(() => window.changes.push([performance.now(), answer.textContent.length]))
          .observe(answer, {childList: true, subtree: true, characterData: true});
        }""")
        page.fill("#question", QUESTION)
        asked = page.evaluate("performance.now()")
        page.click("#ask-btn")
        page.locator("#answer[data-state=done]").wait_for()
        done = page.evaluate("performance.now()")
        changes = [c for c in page.evaluate("window.changes") if c[1] > 0]
        page.locator("#answer button.cite").first.click()
        page.locator("#passage").wait_for()
        page.wait_for_timeout(400)  # the smooth scroll to the passage
        page.screenshot(path=str(out), full_page=True)
        answered = page.text_content("#answer") or ""
        citation = page.text_content("#passage-title") or ""
        # a question the manual cannot answer: the page says so and lists the passages as related
        page.fill("#question", UNANSWERABLE)
        page.click("#ask-btn")
        page.locator("#answer[data-state=unanswered]").wait_for()
        page.wait_for_timeout(200)
        page.screenshot(path=str(out.with_name(out.stem + "_unanswered" + out.suffix)), full_page=True)
        return {"indexed_s": round(indexed_s, 2),
            "first_text_s": round((changes[0][0] - asked) / 1000, 3) if changes else -1.0,
            "answer_s": round((done - asked) / 1000, 3),
            "answer_updates": len({n for _, n in changes}),
            "answer": answered, "citation": citation,
            "unanswered": page.text_content("#answer") or "",
            "unanswered_status": page.text_content("#ask-status") or ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "kb_page.png",
                        help="where the screenshot goes")
    args = parser.parse_args()

    from infra.home import HomeLayout
    from infra.serving.runtime import key_store

    load = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="kb-page-"))
    proc = None
    try:
        key, _ = key_store(HomeLayout(tmp)).add("screenshot", ["kb:legal:read", "kb:legal:write", "kb:medical:read"])
        document = tmp / "pump-manual.html"
        document.write_text(DOCUMENT, encoding="utf-8")
        proc, url = start_server(tmp)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        figures = drive(url, key, document, args.out)
        print(json.dumps({"bench": "kb_page_screenshot", "screenshot": str(args.out.relative_to(ROOT))
                          if args.out.is_relative_to(ROOT) else str(args.out), "png_bytes": args.out.stat().st_size,
                          **figures, "load_avg_1m": round(load, 2)}, ensure_ascii=False))
    finally:
        if proc is not None:
            stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
