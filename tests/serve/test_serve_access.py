"""Access control and limits against a real uvicorn server: 401, 403, 429, 413, 504, the IP allow-list."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import jwt
import pytest

from infra.serving.runtime import key_store

ROW = {"account_id": "A1", "x": [1.0, 2.0, 3.0, 4.0]}
BODY = {"rows": [ROW]}


def test_credentials_scopes_and_jwt(live_server) -> None:
    live = live_server(jwt_hs256_secret="s3cret-for-tests-only-32-bytes-long!")
    url = f"{live.url}/v1/toy/score"
    good = live.add_key("toy:score")
    other = live.add_key("sensor:predict")
    with httpx.Client(timeout=10) as client:
        r = client.post(url, json=BODY)
        assert r.status_code == 401 and "WWW-Authenticate" in r.headers
        assert client.post(url, json=BODY, headers={"X-API-Key": "ifk_000000000000_" + "x" * 43}).status_code == 401
        assert client.post(url, json=BODY, headers={"X-API-Key": good[:-1] + ("B" if good.endswith("A") else "A")}).status_code in (401,)
        assert client.post(url, json=BODY, headers={"Authorization": "Basic abc"}).status_code == 401
        r = client.post(url, json=BODY, headers={"X-API-Key": other})
        assert r.status_code == 403 and "toy:score" in r.json()["detail"]
        r = client.post(url, json=BODY, headers={"X-API-Key": good})
        assert r.status_code == 200 and r.json() == {"model": "toy", "model_version": 1, "scores": [10.0]}
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {good}"}).status_code == 200

        exp = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        token = jwt.encode({"sub": "svc-1", "scope": "toy:score", "exp": exp},
                           "s3cret-for-tests-only-32-bytes-long!", algorithm="HS256")
        forged = jwt.encode({"sub": "svc-1", "scope": "toy:score", "exp": exp},
                            "another-secret-of-32-bytes-or-more!!", algorithm="HS256")
        expired = jwt.encode({"sub": "svc-1", "scope": "toy:score", "exp": exp - dt.timedelta(hours=1)},
                             "s3cret-for-tests-only-32-bytes-long!", algorithm="HS256")
        no_scope = jwt.encode({"sub": "svc-1", "scope": "sensor:predict", "exp": exp},
                              "s3cret-for-tests-only-32-bytes-long!", algorithm="HS256")
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {forged}"}).status_code == 401
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {expired}"}).status_code == 401
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {no_scope}"}).status_code == 403

        key_store(live.layout).revoke(good.split("_")[1])
        assert client.post(url, json=BODY, headers={"X-API-Key": good}).status_code == 401


def test_rs256_tokens(live_server) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    live = live_server(jwt_rs256_public_key=public_pem, jwt_audience="indusflow")
    exp = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    token = jwt.encode({"sub": "svc", "scopes": ["toy:score"], "aud": "indusflow", "exp": exp}, private,
                       algorithm="RS256")
    wrong_aud = jwt.encode({"sub": "svc", "scopes": ["toy:score"], "aud": "other", "exp": exp}, private,
                           algorithm="RS256")
    with httpx.Client(timeout=10) as client:
        url = f"{live.url}/v1/toy/score"
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert client.post(url, json=BODY, headers={"Authorization": f"Bearer {wrong_aud}"}).status_code == 401


def _exhaust(urls: list[str], key: str, n: int) -> list[httpx.Response]:
    out = []
    with httpx.Client(timeout=10) as client:
        for i in range(n):
            out.append(client.post(f"{urls[i % len(urls)]}/v1/toy/score", json=BODY, headers={"X-API-Key": key}))
    return out


def test_rate_limit_per_key_in_memory(live_server) -> None:
    live = live_server(default_rate_limit="1000/minute")
    limited = live.add_key("toy:score", rate_limit="3/minute")
    free = live.add_key("toy:score")
    responses = _exhaust([live.url], limited, 4)
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert 1 <= int(responses[-1].headers["Retry-After"]) <= 60
    assert responses[-1].headers["X-RateLimit-Limit"] == "3"
    assert [r.status_code for r in _exhaust([live.url], free, 3)] == [200, 200, 200]  # per key
    assert live.services.metrics.registry.get_sample_value("indusflow_rate_limited_total", {"scope": "toy:score"}) == 1


def test_rate_limit_shared_through_redis(live_server, redis_url) -> None:
    """Two replicas (two servers) count one key's requests in one Redis."""
    a = live_server(redis_url=redis_url)
    b = live_server(redis_url=redis_url)
    key = a.add_key("toy:score", rate_limit="4/minute")
    responses = _exhaust([a.url, b.url], key, 6)
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 429, 429]
    assert all(int(r.headers["Retry-After"]) >= 1 for r in responses[4:])


def test_rate_limiter_down_fails_closed(live_server) -> None:
    """No Redis at the configured URL: requests are refused with 503, not served unlimited."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]  # closed again at once: nothing listens there
    live = live_server(redis_url=f"redis://127.0.0.1:{dead}/0")
    r = _exhaust([live.url], live.add_key("toy:score"), 1)[0]
    assert r.status_code == 503 and r.headers["Retry-After"] == "5" and "rate limiter" in r.json()["detail"]


def test_body_and_row_limits(live_server) -> None:
    live = live_server(max_body_bytes=2000, max_rows=8)
    key = live.add_key()
    url = f"{live.url}/v1/toy/score"
    with httpx.Client(timeout=10, headers={"X-API-Key": key}) as client:
        r = client.post(url, json={"rows": [ROW] * 9})
        assert r.status_code == 413 and "limit is 8" in r.json()["detail"]
        assert client.post(url, json={"rows": [ROW] * 8}).status_code == 200
        big = json.dumps({"rows": [ROW] * 100}).encode()
        assert len(big) > 2000
        r = client.post(url, content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "2000 bytes" in r.json()["detail"]

        def chunks():  # no Content-Length: the limit is counted while the body streams in
            yield big[:1500]
            yield big[1500:]

        r = client.post(url, content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413


def test_request_timeout(live_server) -> None:
    live = live_server(request_timeout_s=0.3)
    live.control.delay_s = 1.0
    with httpx.Client(timeout=10) as client:
        r = client.post(f"{live.url}/v1/toy/score", json=BODY, headers={"X-API-Key": live.add_key()})
    assert r.status_code == 504


@pytest.mark.parametrize(("allow", "expected"), [("10.0.0.0/8, 192.168.1.7", 403), ("10.0.0.0/8,127.0.0.0/8", 200)])
def test_ip_allow_list(live_server, allow: str, expected: int) -> None:
    live = live_server(ip_allow_list=allow)
    with httpx.Client(timeout=10) as client:
        r = client.post(f"{live.url}/v1/toy/score", json=BODY, headers={"X-API-Key": live.add_key()})
        assert r.status_code == expected
        assert client.get(f"{live.url}/healthz").status_code == expected
