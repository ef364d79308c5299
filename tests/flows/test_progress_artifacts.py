"""Long work reports its progress: a Prefect progress artifact that reaches 100, and i/N lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest


def progress_artifacts(description_start: str) -> list[float]:
    """The values of the progress artifacts whose description starts with ``description_start``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"])))
    return [float(a.data) for a in arts if (a.description or "").startswith(description_start)]


def test_ingest_progress_reaches_100(tmp_path: Path, monkeypatch, caplog, capsys) -> None:
    pytest.importorskip("milvus_lite")
    pytest.importorskip("iscc_tika")
    from flows.rag.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("INDUSFLOW_MILVUS_URI", str(tmp_path / "progress.db"))
    corpus = tmp_path / "kb"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"note{i}.txt").write_text(f"Maintenance note {i}: the pump seal is checked every {i + 2} weeks.")
    caplog.set_level(logging.INFO, logger="tasks.progress")
    finished: list[str] = []  # the task-run engine's lines, whatever its propagation
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: finished.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("prefect.task_runs").addHandler(handler)
    try:
        assert main(["ingest", str(corpus), "--collection", "kb_progress", "--json"]) == 0
    finally:
        logging.getLogger("prefect.task_runs").removeHandler(handler)
    # the progress line replaces the per-task lines of the fan-out (parse, embed, write per file);
    # the report task after it still logs its line
    assert finished == ["Finished in state Completed()"], finished
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["chunked_documents"] == 3
    assert progress_artifacts("Ingest into kb_progress:") == [100.0]
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.progress"]
    assert lines[0].startswith("ingest kb_progress: 0/3 files (0%)")
    assert lines[-1].startswith("ingest kb_progress: 3/3 files (100%)") and "ETA 00:00" in lines[-1]
