"""No client can break or poison another's scoring: a bad request in a dynamic batch gets its
own 4xx naming the field while the valid ones get the score they get alone; timestamps ahead of
the server clock, over-long or non-scalar ids and labels without ``fraud:label`` are refused."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.serve import fraud as serve_fraud
from infra.home import HomeLayout
from solutions.fraud.online import MAX_ID_CHARS
from tests.serve.fraud_helpers import FraudServer, TinyFraud, api_key, home_with_registry, train_tiny_fraud


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[HomeLayout, TinyFraud]:
    layout = HomeLayout(tmp_path_factory.mktemp("fraud-isolation-home"))
    return layout, train_tiny_fraud(layout)


def _row(i: int, **extra: Any) -> dict[str, Any]:
    return {"transaction_id": f"t{i}", "account_id": f"A{i}", "timestamp": f"2025-01-01T10:{i:02d}:00",
            "amount": 5.0 + i, "terminal_id": f"T{i}", **extra}


def _score_one(client: httpx.Client, server: FraudServer, key: str, row: dict[str, Any]) -> httpx.Response:
    """One transaction sent to /v1/fraud/score with ``key``."""
    return client.post(f"{server.url}/v1/fraud/score", json={"transactions": [row]}, headers={"X-API-Key": key})


def _valid(i: int) -> bytes:
    """A valid request; every other one takes the general validation path (amount as a string)."""
    row = _row(i, amount=str(5.0 + i)) if i % 2 else _row(i)
    return httpx.Request("POST", "/", json={"transactions": [row]}).content


def _bad(i: int) -> tuple[bytes, str]:
    """A request refused on its own, and the field its 422 names."""
    if i % 2:  # no terminal_id, which the model's terminal windows need (general path: amount a string)
        row = {k: v for k, v in _row(i, amount=str(5.0 + i)).items() if k != "terminal_id"}
        return httpx.Request("POST", "/", json={"transactions": [row]}).content, "terminal_id"
    body = httpx.Request("POST", "/", json={"transactions": [_row(i, account_id="SURROGATE")]}).content
    return body.replace(b'"SURROGATE"', b'"\\ud800"'), "account_id"  # a lone surrogate: valid JSON


async def _post_all(url: str, key: str, bodies: list[bytes]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(
            client.post(f"{url}/v1/fraud/score", content=b, headers={"X-API-Key": key,
                                                                      "content-type": "application/json"})
            for b in bodies))


def test_a_bad_request_in_a_batch_gets_its_own_4xx_and_the_valid_ones_their_scores_alone(
        tiny: tuple[HomeLayout, TinyFraud], tmp_path: Path) -> None:
    src, _ = tiny
    valid = list(range(24))
    bad = list(range(24, 40))
    # each valid request scored alone, one after the other, on a fresh state
    alone_home = home_with_registry(src, tmp_path / "alone")
    with FraudServer(alone_home, batch_max_size=1) as server, httpx.Client(timeout=60) as client:
        key = api_key(alone_home)
        alone = {}
        for i in valid:
            r = client.post(f"{server.url}/v1/fraud/score", content=_valid(i),
                            headers={"X-API-Key": key, "content-type": "application/json"})
            assert r.status_code == 200, r.text
            alone[f"t{i}"] = r.json()["results"][0]["score"]
    # the same valid requests, mixed with bad ones, concurrently: batched together
    home = home_with_registry(src, tmp_path / "mixed")
    bodies = [_valid(i) for i in valid] + [_bad(i)[0] for i in bad]
    order = sorted(range(len(bodies)), key=lambda j: (j * 7) % len(bodies))  # interleave valid and bad
    with FraudServer(home, batch_max_wait_ms=50) as server:
        key = api_key(home)
        responses = asyncio.run(_post_all(server.url, key, [bodies[j] for j in order]))
        calls = server.app.state.serving.metrics.render().decode()
    by_index = dict(zip(order, responses, strict=True))
    for n, i in enumerate(valid):
        r = by_index[n]
        assert r.status_code == 200, r.text
        assert abs(r.json()["results"][0]["score"] - alone[f"t{i}"]) <= 1e-6
    for n, i in enumerate(bad, start=len(valid)):
        r = by_index[n]
        assert r.status_code == 422, r.text
        assert r.json()["detail"]["column"] == _bad(i)[1], r.text
    match = re.search(r'^indusflow_batch_size_count\{model="fraud-seq"\} ([0-9.e+]+)$', calls, re.MULTILINE)
    assert match and int(float(match.group(1))) < len(bodies)  # the requests did share model calls


def test_a_future_timestamp_is_refused_and_the_409_names_no_other_time(tiny: tuple[HomeLayout, TinyFraud],
                                                                      tmp_path: Path) -> None:
    src, _ = tiny
    home = home_with_registry(src, tmp_path / "home")
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        key = api_key(home)

        def post(row: dict[str, Any]) -> httpx.Response:
            return _score_one(client, server, key, row)

        future = post(_row(1, timestamp="2200-01-01T00:00:00"))
        assert future.status_code == 422, future.text
        assert future.json()["detail"]["column"] == "timestamp"
        assert post(_row(2, account_id="A1", timestamp="2025-03-01T12:34:56")).status_code == 200
        older = post(_row(3, account_id="A1", timestamp="2025-03-01T08:00:00"))
        assert older.status_code == 409 and "older" in older.text
        assert "12:34" not in older.text  # the account's latest transaction time stays private


def test_an_admin_resets_a_locked_account_audited(tiny: tuple[HomeLayout, TinyFraud], tmp_path: Path) -> None:
    """An account whose latest transaction was mis-dated (inside the skew, or before the bound existed)
    refuses its real later ones with 409 until an admin resets its online state."""
    src, _ = tiny
    home = home_with_registry(src, tmp_path / "home")
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        key, admin = api_key(home), api_key(home, "admin")
        assert _score_one(client, server, key, _row(1, account_id="LOCKED", timestamp="2025-03-09T23:00:00")
                          ).status_code == 200
        real = _row(2, account_id="LOCKED", timestamp="2025-03-01T09:00:00")
        assert _score_one(client, server, key, real).status_code == 409

        def reset(k: str, **body: Any) -> httpx.Response:
            return client.post(f"{server.url}/v1/fraud/state/reset", json=body, headers={"X-API-Key": k})

        assert reset(key, account_id="LOCKED").status_code == 403  # fraud:score alone may not
        assert reset(admin, account_id="LOCKED", terminal_id="T1").status_code == 422
        done = reset(admin, account_id="LOCKED")
        assert done.status_code == 200 and done.json() == {"kind": "account", "found": True}
        assert reset(admin, account_id="NEVER-SEEN").json()["found"] is False
        again = _score_one(client, server, key, real)
        assert again.status_code == 200, again.text
    audit = (home.serving() / "audit.jsonl").read_text()
    lines = [json.loads(line) for line in audit.splitlines()]
    resets = [a for a in lines if a.get("endpoint") == "/v1/fraud/state/reset" and a.get("status") == 200]
    assert [a["decisions"] for a in resets] == [{"account_reset": 1}, {"account_reset": 0}]
    assert len(resets[0]["subjects"]) == 1 and "LOCKED" not in audit  # the account id is hashed


def test_over_long_and_non_scalar_ids_are_refused(tiny: tuple[HomeLayout, TinyFraud], tmp_path: Path) -> None:
    src, _ = tiny
    home = home_with_registry(src, tmp_path / "home")
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        key = api_key(home)

        def post(row: dict[str, Any]) -> httpx.Response:
            return _score_one(client, server, key, row)

        for field, value in [("transaction_id", "x" * 1_000_000), ("terminal_id", "T" * (MAX_ID_CHARS + 1)),
                             ("account_id", ["A1", "A2"]), ("terminal_id", {"id": "T1"})]:
            r = post(_row(1, **{field: value}))
            assert r.status_code == 422, (field, r.text[:300])
            assert r.json()["detail"]["column"] == field
        assert post(_row(1, transaction_id="x" * MAX_ID_CHARS)).status_code == 200


def test_a_label_in_a_score_request_needs_the_label_scope(tiny: tuple[HomeLayout, TinyFraud],
                                                          tmp_path: Path) -> None:
    src, _ = tiny
    home = home_with_registry(src, tmp_path / "home")
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        def post(key: str, row: dict[str, Any]) -> httpx.Response:
            return _score_one(client, server, key, row)

        score_only = api_key(home, serve_fraud.SCOPE)
        refused = post(score_only, _row(1, label=1))
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"]["column"] == "label"
        assert post(score_only, _row(1)).status_code == 200  # nothing was applied by the refused one
        both = api_key(home, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
        assert post(both, _row(2, label=1)).status_code == 200


def test_deeply_nested_bodies_get_a_4xx(tiny: tuple[HomeLayout, TinyFraud], tmp_path: Path) -> None:
    """orjson stops at 1024 levels and Python's parser, which the score route falls back to, ran
    out of stack: the RecursionError answered 500."""
    src, _ = tiny
    home = home_with_registry(src, tmp_path / "home")
    depth = 100_000
    nested = {
        "arrays": b'{"transactions": ' + b"[" * depth + b"]" * depth + b"}",
        "objects": b'{"transactions": [' + b'{"a": ' * depth + b"1" + b"}" * depth + b"]}",
    }
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        key = api_key(home, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
        headers = {"X-API-Key": key, "content-type": "application/json"}
        for route in ("/v1/fraud/score", "/v1/fraud/labels"):
            for what, body in nested.items():
                r = client.post(f"{server.url}{route}", content=body, headers=headers)
                assert 400 <= r.status_code < 500, (route, what, r.status_code, r.text[:300])
        assert _score_one(client, server, key, _row(1)).status_code == 200  # and the server is fine
