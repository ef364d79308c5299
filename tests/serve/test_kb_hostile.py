"""The KB ingest under hostile uploads (issue 46): the ingest child gets only the environment it
needs, the job queue is bounded, a job has a time limit, and a file that stopped an ingest is
quarantined and not ingested again until it changes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from infra.home import HomeLayout
from infra.settings import KbSettings


def _engine(home: HomeLayout, in_thread: bool = False, **settings):
    from flows.serve.kb_engine import KbEngine
    from solutions.rag.collections import kb_collection

    col = kb_collection("legal", home)
    return KbEngine({"legal": col}, home, KbSettings(collections="legal", **settings), client=object(),
                    embedder=None, ingest_in_thread=in_thread), col


def test_the_ingest_child_gets_no_serving_secret_and_no_llm_key(tmp_path: Path, monkeypatch) -> None:
    secrets = {"INDUSFLOW_SERVE_JWT_HS256_SECRET": "jwt-secret-value-1", "INDUSFLOW_LLM_API_KEY": "llm-key-value-2",
               "INDUSFLOW_SERVE_AUDIT_SALT": "audit-salt-value-3", "INDUSFLOW_SERVE_REDIS_URL": "redis://:pw-4@r:6379",
               "OPENAI_API_KEY": "sk-shell-key-5", "AWS_SECRET_ACCESS_KEY": "aws-secret-6", "HF_TOKEN": "hf-token-7",
               "GITHUB_TOKEN": "ghp-token-8", "INDUSFLOW_TUNE_STORAGE_URL": "postgresql://u:pw-9@db/optuna"}
    needed = {"INDUSFLOW_EMBED_API_KEY": "embed-key", "INDUSFLOW_MILVUS_URI": "http://milvus:19530",
              "INDUSFLOW_MILVUS_TOKEN": "root:Milvus", "INDUSFLOW_TIKA_SERVER_URL": "http://tika:9998",
              "INDUSFLOW_KB_COLLECTIONS": "legal", "PREFECT_API_URL": "http://prefect:4200/api",
              "PYTHONPATH": "/src", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    for name, value in {**secrets, **needed}.items():
        monkeypatch.setenv(name, value)
    engine, _ = _engine(HomeLayout(tmp_path / "home"))
    env = engine.child_env()
    assert not set(secrets) & set(env), sorted(set(secrets) & set(env))  # main's code passed them all
    assert not any(v in "\n".join(env.values()) for v in secrets.values())
    assert {k: env.get(k) for k in needed} == needed
    assert env["INDUSFLOW_HOME"] == str(tmp_path / "home") and "PATH" in env


def _wait(predicate, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_the_job_queue_of_a_collection_is_bounded(tmp_path: Path, monkeypatch) -> None:
    from flows.serve.kb_engine import MAX_ACTIVE_JOBS

    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    engine, col = _engine(HomeLayout(tmp_path / "home"), in_thread=True)
    release = threading.Event()

    def slow_job(job) -> None:  # an ingest that takes its time
        release.wait(30)
        job.state = "done"

    monkeypatch.setattr(engine, "run_job", slow_job)
    try:
        for _ in range(MAX_ACTIVE_JOBS):
            assert not engine.queue_full(col)  # main's code had no bound: jobs queued without end
            engine.submit(col, ["lease.txt"])
        assert engine.queue_full(col)  # the upload route answers 429 (before reading the body when it can)
        release.set()
        _wait(lambda: not engine.queue_full(col))
    finally:
        release.set()
        engine.close()


def test_an_ingest_child_past_the_time_limit_is_stopped_and_its_files_quarantined(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    from infra.processes import process_alive
    from tasks.ingest import load_quarantine_cache, quarantine_cache_path

    home = HomeLayout(tmp_path / "home")
    monkeypatch.setenv("INDUSFLOW_HOME", str(home.root))
    monkeypatch.setenv("INDUSFLOW_MILVUS_URI", "http://127.0.0.1:9")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    engine, col = _engine(home, ingest_timeout_s=1.0)
    stuck = str(col.folder / "nested.zip")  # what a child was parsing when its time ran out
    quarantine_cache_path(col.milvus).parent.mkdir(parents=True, exist_ok=True)
    quarantine_cache_path(col.milvus).write_text(json.dumps({stuck: {"hash": "h", "items": [], "unfinished": 1}}))
    try:
        job = engine.submit(col, ["nested.zip"])
        _wait(lambda: (j := engine.job(job.job_id)) is not None and not j.active)
        done = engine.job(job.job_id)
        assert done.state == "failed" and "INDUSFLOW_KB_INGEST_TIMEOUT_S" in done.error, done
        assert done.pid is None or not process_alive(done.pid)
        assert load_quarantine_cache(col.milvus)[stuck]["items"][0]["reason"] == "timed_out"
    finally:
        engine.close()


def test_an_adopted_child_past_the_time_limit_is_stopped_too(tmp_path: Path, monkeypatch) -> None:
    """After a restart the server adopts a child that still runs: the time limit counts from the
    child's recorded start."""
    import datetime as dt
    import subprocess
    import sys

    from solutions.rag.library import IngestJob, save_job

    home = HomeLayout(tmp_path / "home")
    monkeypatch.setenv("INDUSFLOW_HOME", str(home.root))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    engine, _ = _engine(home, ingest_timeout_s=60.0)
    # a flow run's process (python -m prefect.engine) that outlived its server
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "prefect.engine"],
                             start_new_session=True)
    try:
        started = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).isoformat(timespec="seconds")
        job = IngestJob(job_id="0123456789abcdef", collection="legal", files=[{"name": "big.zip", "status": "running"}],
                        state="running", how="deployment", pid=child.pid, started_at=started, attempts=1)
        home.kb_jobs().mkdir(parents=True, exist_ok=True)
        save_job(home.kb_jobs(), job)
        assert [j.job_id for j in engine.recover()] == [job.job_id]
        _wait(lambda: not engine.job(job.job_id).active, timeout_s=60)
        assert child.wait(timeout=30) == -9  # main's code waited for it without end
        assert "INDUSFLOW_KB_INGEST_TIMEOUT_S" in engine.job(job.job_id).error
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        engine.close()
