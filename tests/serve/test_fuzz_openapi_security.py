"""``/docs`` can authenticate: the OpenAPI document declares the API-key header and the bearer
scheme, every protected route references them (the probes and the docs do not), and a request
sent the way Swagger's *Authorize* button sends it (the declared header with a key) succeeds."""

from __future__ import annotations

import httpx

from tests.serve.conftest import Live

PROBES = {"/healthz", "/readyz"}


def test_openapi_declares_the_credentials_and_swagger_style_requests_work(live_server) -> None:
    live: Live = live_server()
    schema = httpx.get(f"{live.url}/openapi.json").json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["ApiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key",
                                 "description": schemes["ApiKey"]["description"]}
    assert schemes["Bearer"]["type"] == "http" and schemes["Bearer"]["scheme"] == "bearer"
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            security = operation.get("security")
            if path in PROBES:
                assert not security, (method, path)
            else:
                assert security == [{"ApiKey": []}, {"Bearer": []}], (method, path)
    assert "/v1/toy/score" in schema["paths"] and "/metrics" in schema["paths"]
    # what Swagger sends after Authorize: the scheme's header with the key the user typed in
    key = live.add_key("toy:score", "metrics:read")
    body = {"rows": [{"account_id": "a", "x": [1, 2, 3, 4]}]}
    for header in ({schemes["ApiKey"]["name"]: key}, {"Authorization": f"Bearer {key}"}):
        assert httpx.post(f"{live.url}/v1/toy/score", json=body, headers=header).status_code == 200
        assert httpx.get(f"{live.url}/metrics", headers=header).status_code == 200
    assert httpx.post(f"{live.url}/v1/toy/score", json=body).status_code == 401
    # the docs page itself needs no key and keeps what was typed into Authorize across reloads
    page = httpx.get(f"{live.url}/docs")
    assert page.status_code == 200 and "persistAuthorization" in page.text
