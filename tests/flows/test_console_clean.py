"""The README's RAG commands print no Python warning, DEBUG line, WARNING or traceback on a fresh
home (each runs as a user runs it: its own process, its own ephemeral Prefect API)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("milvus_lite")
pytest.importorskip("iscc_tika")

NOISE = re.compile(r"Warning|WARNING|DEBUG|Traceback")


def run_cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "INDUSFLOW_"))}
    env.update(INDUSFLOW_HOME=str(home / "indusflow"), PREFECT_HOME=str(home / "prefect"),
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, *args], check=False, env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])


def test_rag_ingest_and_ask_print_no_warning_debug_or_traceback(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    # line breaks and tabs, as parsed pages have them (they once read as unknown pieces)
    (docs / "pump.txt").write_text("Pump manual\n\tThe pump seal is checked\nevery six weeks.\n\n"
                                   "泵的密封每六周检查一次。\n")
    (docs / "invoice.html").write_text("<html><body><h1>Invoices</h1>\n<p>Invoices are paid\n"
                                       "within thirty days.</p></body></html>")
    ingest = run_cli(["-m", "flows.rag", "ingest", str(docs)], tmp_path)
    assert ingest.returncode == 0, ingest.stderr
    assert "2 chunked" in ingest.stdout and "warning" not in ingest.stdout.lower()
    ask = run_cli(["-m", "flows.rag", "ask", "How often is the pump seal checked?"], tmp_path)
    assert ask.returncode == 0, ask.stderr
    assert "pump.txt" in ask.stdout
    for run in (ingest, ask):
        noisy = [line for line in run.stderr.splitlines() if NOISE.search(line)]
        assert noisy == [], "\n".join(noisy)
    assert "ingest rag_chunks: 2/2 files (100%)" in ingest.stderr  # the progress line
