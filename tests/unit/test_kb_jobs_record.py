"""The ingest job record (solutions.rag.library), a process's liveness as job recovery reads it,
and the archive members an upload cap counts (tasks.documents.archive_members)."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from infra.processes import process_alive
from solutions.rag.library import IngestJob, flow_run_name, load_job, recorded_jobs, save_job
from tasks.documents import archive_members


def test_a_job_record_is_private_and_round_trips(tmp_path: Path) -> None:
    job = IngestJob(job_id="0123456789abcdef", collection="legal", files=[{"name": "a.txt", "status": "queued"}],
                    pid=12, owner_pid=34, attempts=1)
    save_job(tmp_path, job)
    path = tmp_path / "0123456789abcdef.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_job(tmp_path, job.job_id) == job and [j.job_id for j in recorded_jobs(tmp_path)] == [job.job_id]
    assert set(job.public()) >= {"flow_run_id", "flow_run_name"} and "pid" not in job.public()
    assert flow_run_name(job) == "kb-legal-0123456789abcdef"  # no document name reaches Prefect
    assert load_job(tmp_path, "../../etc/passwd") is None
    with pytest.raises(ValueError):
        save_job(tmp_path, IngestJob(job_id="../x", collection="legal", files=[]))
    path.write_text("{not json")
    assert load_job(tmp_path, job.job_id) is None


def test_process_alive_checks_the_command_line_and_zombies() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_alive(proc.pid)
        # the child's command line can read empty while its exec settles on a loaded machine (a CI run
        # saw it): wait for it, bounded
        deadline = time.monotonic() + 10
        while not process_alive(proc.pid, "time.sleep") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_alive(proc.pid, "time.sleep")
        assert not process_alive(proc.pid, "flows.rag.job")  # a recycled pid is another program
        proc.kill()
        for _ in range(100):  # killed, not yet reaped: a zombie is not alive
            if not process_alive(proc.pid):
                break
            time.sleep(0.02)
        assert not process_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not process_alive(proc.pid)
    assert process_alive(os.getpid())


def test_archive_members_counts_directories_only(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for i in range(3):
            data = f"member {i}".encode()
            info = tarfile.TarInfo(f"docs/m{i}.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    (tmp_path / "a.tgz").write_bytes(buf.getvalue())
    docx = io.BytesIO()
    with zipfile.ZipFile(docx, "w") as z:  # an office package is a document, not an archive
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", "<w:document/>")
    (tmp_path / "b.docx").write_bytes(docx.getvalue())
    (tmp_path / "c.txt").write_text("plain")
    assert archive_members(tmp_path / "a.tgz", 10) == 3 and archive_members(tmp_path / "a.tgz", 1) == 2
    assert archive_members(tmp_path / "b.docx", 10) == 0 and archive_members(tmp_path / "c.txt", 10) == 0
