"""What a hostile or careless client sends gets a 4xx and leaves a trace (issue 26, item 4).

Against a real uvicorn on 127.0.0.1: signed JWTs with claims of the wrong type or an endless
lifetime get 401 (``"scope": 5`` answered 500 before, a ten-year token was accepted), requests
without a valid credential hit a per-address rate limit (there was none), and ``/metrics`` reads
and refusals are audited with the client address (``/metrics`` was never audited and no line
had an address).
"""

from __future__ import annotations

import datetime as dt
import json

import httpx
import jwt

SECRET = "s3cret-for-tests-only-32-bytes-long!"
BODY = {"rows": [{"account_id": "A1", "x": [1.0, 2.0, 3.0, 4.0]}]}


def _token(**claims) -> str:
    now = dt.datetime.now(dt.UTC)
    return jwt.encode({"sub": "svc-1", "scope": "toy:score", "exp": now + dt.timedelta(minutes=5), **claims},
                      SECRET, algorithm="HS256")


def test_signed_tokens_with_wrong_claim_types_or_lifetimes_get_401(live_server) -> None:
    live = live_server(jwt_hs256_secret=SECRET, jwt_max_lifetime_s=3600)
    url = f"{live.url}/v1/toy/score"
    now = dt.datetime.now(dt.UTC)
    cases = {
        "scope is a number": _token(scope=5),
        "scope is an object": _token(scope={"toy:score": True}),
        "scopes holds a number": _token(scopes=["toy:score", 7]),
        "scopes is a string": _token(scopes="toy:score"),
        "sub is a number": _token(sub=42),
        "lives ten years": _token(exp=now + dt.timedelta(days=3650)),
        "issued a day before it expires": _token(iat=now - dt.timedelta(hours=23), exp=now + dt.timedelta(hours=1)),
    }
    with httpx.Client(timeout=10) as client:
        for what, token in cases.items():
            r = client.post(url, json=BODY, headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 401, (what, r.status_code, r.text)
            assert "WWW-Authenticate" in r.headers
        ok = _token(iat=now, exp=now + dt.timedelta(minutes=50))
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {ok}"}).status_code == 200
        listed = _token(scope=None, scopes=["toy:score"])
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {listed}"}).status_code == 200
        too_long = _token(exp=now + dt.timedelta(hours=2))
        assert "lives longer" in client.post(url, json=BODY, headers={"Authorization": f"Bearer {too_long}"}).text


def test_requests_without_a_valid_credential_are_rate_limited_per_address(live_server) -> None:
    live = live_server(unauthenticated_rate_limit="5/minute")
    url = f"{live.url}/v1/toy/score"
    good = live.add_key("toy:score")
    with httpx.Client(timeout=10) as client:
        codes = [client.post(url, json=BODY, headers={"X-API-Key": f"ifk_guess{i:07d}_" + "x" * 43}).status_code
                 for i in range(7)]
        assert codes == [401] * 5 + [429] * 2, codes
        r = client.post(url, json=BODY)
        assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60
        # a valid key from the same address has its own limit
        assert client.post(url, json=BODY, headers={"X-API-Key": good}).status_code == 200
    assert live.services.metrics.registry.get_sample_value(
        "indusflow_rate_limited_total", {"scope": "unauthenticated"}) == 3


def test_metrics_reads_and_refusals_are_audited_with_the_client_address(live_server) -> None:
    live = live_server()
    reader = live.add_key("metrics:read")
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{live.url}/metrics").status_code == 401
        assert client.get(f"{live.url}/metrics", headers={"X-API-Key": reader}).status_code == 200
        assert client.post(f"{live.url}/v1/toy/score", json=BODY, headers={"X-API-Key": reader}).status_code == 403
        assert client.get(f"{live.url}/healthz").status_code == 200
    lines = [json.loads(line) for line in (live.layout.serving() / "audit.jsonl").read_text().splitlines()]
    seen = [(e["endpoint"], e["status"], e["client"]) for e in lines]
    assert ("/metrics", 401, "127.0.0.1") in seen, seen
    assert ("/metrics", 200, "127.0.0.1") in seen, seen
    assert ("/v1/toy/score", 403, "127.0.0.1") in seen, seen
    assert not [e for e in lines if e["endpoint"] == "/healthz"]  # liveness probes are not audited
    assert all(e["client"] == "127.0.0.1" for e in lines)
