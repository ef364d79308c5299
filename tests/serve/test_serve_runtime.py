"""The running API against a real uvicorn server: audit, metrics, readiness, hot reload, breaker."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import httpx

from infra.serving.audit import AuditLog

ACCOUNT = "ACC-7731-PRIVATE"


def test_audit_line_has_no_pii_and_rotates(live_server, tmp_path) -> None:
    live = live_server()
    key = live.add_key("toy:score")
    with httpx.Client(timeout=10) as client:
        r = client.post(f"{live.url}/v1/toy/score", headers={"X-API-Key": key},
                        json={"rows": [{"account_id": ACCOUNT, "x": [5, 5, 5, 5]}, {"account_id": "B2", "x": [0, 0, 0, 0]}]})
        assert r.status_code == 200
        assert client.post(f"{live.url}/v1/toy/score", json={"rows": []}).status_code == 401
    path = live.layout.serving() / "audit.jsonl"
    text = path.read_text()
    assert ACCOUNT not in text and key not in text and key.split("_", 2)[2] not in text
    lines = [json.loads(line) for line in text.splitlines()]
    scored = [e for e in lines if e["status"] == 200]
    assert len(scored) == 1
    entry = scored[0]
    assert entry["key_id"] == key.split("_")[1] and entry["endpoint"] == "/v1/toy/score"
    assert entry["model"] == "toy" and entry["model_version"] == 1 and entry["rows"] == 2
    assert entry["decisions"] == {"flagged": 1, "passed": 1} and entry["latency_ms"] > 0
    assert live.services.audit.hash_id(ACCOUNT) in entry["subjects"] and len(entry["subjects"]) == 2
    assert any(e["status"] == 401 and e["key_id"] is None for e in lines)  # refusals are audited too

    folder = tmp_path / "rot"
    log = AuditLog(folder / "a.jsonl", b"salt", max_bytes=1024, backups=2)
    for i in range(100):
        log.write({"i": i, "pad": "x" * 40})
    rotated = sorted(p.name for p in folder.iterdir())
    assert rotated == ["a.jsonl", "a.jsonl.1", "a.jsonl.2"]
    assert all(p.stat().st_size <= 1024 for p in folder.iterdir())
    assert json.loads((folder / "a.jsonl").read_text().splitlines()[-1])["i"] == 99


def test_docs_page_needs_no_internet(live_server) -> None:
    live = live_server(champion=None)
    with httpx.Client(timeout=10) as client:
        page = client.get(f"{live.url}/docs").text
        assert "/docs-assets/swagger-ui-bundle.js" in page and "cdn." not in page
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
            r = client.get(f"{live.url}/docs-assets/{asset}")
            assert r.status_code == 200 and len(r.content) > 10_000
        assert client.get(f"{live.url}/openapi.json").json()["info"]["title"] == "indusflow serving API"


def test_readyz_waits_for_the_champion_and_metrics(live_server) -> None:
    live = live_server(champion=None)
    admin = live.add_key("admin")
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{live.url}/healthz").json() == {"status": "ok"}
        r = client.get(f"{live.url}/readyz")
        assert r.status_code == 503 and "toy" in r.json()["waiting"]
        r = client.post(f"{live.url}/v1/toy/score", headers={"X-API-Key": admin},
                        json={"rows": [{"account_id": "a", "x": [1, 1, 1, 1]}]})
        assert r.status_code == 503 and r.headers["Retry-After"]
        live.register(3.0)
        deadline = time.monotonic() + 10
        while client.get(f"{live.url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.get(f"{live.url}/readyz").json()["models"] == {"toy": 1}
        r = client.post(f"{live.url}/v1/toy/score", headers={"X-API-Key": admin},
                        json={"rows": [{"account_id": "a", "x": [1, 1, 1, 1]}] * 3})
        assert r.json()["scores"] == [12.0] * 3
        assert client.get(f"{live.url}/metrics").status_code == 401
        assert client.get(f"{live.url}/metrics", headers={"X-API-Key": live.add_key("toy:score")}).status_code == 403
        text = client.get(f"{live.url}/metrics", headers={"X-API-Key": live.add_key("metrics:read")}).text
        assert 'indusflow_requests_total{endpoint="/v1/toy/score",method="POST",status="200"} 1.0' in text
        assert 'indusflow_requests_total{endpoint="/v1/toy/score",method="POST",status="503"} 1.0' in text
        assert 'indusflow_request_latency_seconds_bucket{endpoint="/v1/toy/score",le="0.25"}' in text
        assert 'indusflow_batch_size_bucket{le="4.0",model="toy"} 1.0' in text
        assert 'indusflow_model_version{model="toy"} 1.0' in text
        assert 'indusflow_rows_total{model="toy"} 3.0' in text
        assert 'indusflow_breaker_open{model="toy"} 0.0' in text
        assert client.get(f"{live.url}/openapi.json").json()["paths"]["/v1/toy/score"]


def test_hot_reload_under_load(live_server) -> None:
    """Promote a new version while 4 clients send requests: no failure, every answer labelled."""
    live = live_server()
    live.control.delay_s = 0.002
    live.control.load_delay_s = 0.3  # the new version loads while the old one keeps serving
    key = live.add_key("toy:score", rate_limit="100000/minute")
    results: list[tuple[int, int | None, float | None]] = []
    stop = threading.Event()

    def client_loop() -> None:
        with httpx.Client(timeout=10, headers={"X-API-Key": key}) as client:
            while not stop.is_set():
                r = client.post(f"{live.url}/v1/toy/score", json={"rows": [{"account_id": "a", "x": [1, 2, 3, 4]}]})
                body = r.json() if r.status_code == 200 else {}
                results.append((r.status_code, body.get("model_version"), (body.get("scores") or [None])[0]))

    threads = [threading.Thread(target=client_loop) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        live.register(2.0)  # version 2, promoted
        deadline = time.monotonic() + 15
        while live.services.slots[0].version != 2:
            assert time.monotonic() < deadline, "version 2 was not picked up"
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    statuses = Counter(code for code, _, _ in results)
    assert statuses == {200: len(results)}, statuses
    versions = Counter(v for _, v, _ in results)
    assert versions[1] > 0 and versions[2] > 0
    assert all(score == 10.0 * version for _, version, score in results)  # scored by the version named
    seen = [v for _, v, _ in results]
    assert seen.index(2) > 0


def test_breaker_opens_then_recovers(live_server) -> None:
    live = live_server(breaker_error_share=0.5, breaker_min_calls=4, breaker_window_s=30, breaker_cooldown_s=1.0)
    key = live.add_key("toy:score", "metrics:read")
    body = {"rows": [{"account_id": "a", "x": [1, 1, 1, 1]}]}
    with httpx.Client(timeout=10, headers={"X-API-Key": key}) as client:
        url = f"{live.url}/v1/toy/score"
        assert client.post(url, json=body).status_code == 200
        live.control.fail = True
        codes = [client.post(url, json=body).status_code for _ in range(3)]
        assert codes == [500, 500, 500]  # 3 failures of 4 calls: the breaker opens
        r = client.post(url, json=body)
        assert r.status_code == 503 and "3 of the last 4 model calls failed" in r.json()["reason"]
        assert 1 <= int(r.headers["Retry-After"]) <= 1
        assert 'indusflow_breaker_open{model="toy"} 1.0' in client.get(f"{live.url}/metrics").text
        live.control.fail = False
        assert client.post(url, json=body).status_code == 503  # still cooling down: no call reaches it
        time.sleep(1.1)
        r = client.post(url, json=body)
        assert r.status_code == 200 and r.json()["scores"] == [4.0]
        assert client.post(url, json=body).status_code == 200
        assert 'indusflow_breaker_open{model="toy"} 0.0' in client.get(f"{live.url}/metrics").text


def test_the_server_runs_with_its_gc_thresholds() -> None:
    """Python's default thresholds promoted in-flight batches to the oldest generation; full
    collections over the online state then paused scoring (flows.serve.app.GC_THRESHOLDS)."""
    import gc

    from fastapi.testclient import TestClient

    from flows.serve.app import GC_THRESHOLDS, create_app
    from infra.settings import ServeSettings

    # An earlier test's in-thread server that never ran its shutdown may have left the server's
    # thresholds on this process (CI saw it): start from Python's defaults, and restore after.
    outer = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        app = create_app(ServeSettings(fraud_model="", sensor_model=""), build_verticals=[])
        with TestClient(app) as client:
            assert gc.get_threshold() == GC_THRESHOLDS == (50_000, 20, 20)
            assert client.get("/healthz").status_code == 200
        assert gc.get_threshold() == (700, 10, 10)  # given back when the app stops
    finally:
        gc.set_threshold(*outer)
