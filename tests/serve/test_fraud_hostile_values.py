"""Hostile values and timestamps cannot take fraud scoring down or lock an account (issue 46).

* The four-request outage: amounts near 1e308 overflowed an account's running sum to ``inf``
  (stored as null); every later transaction of that account answered 500 and those 500s opened
  the champion's breaker, so all fraud scoring answered 503. Now an amount beyond the bound is the
  client's 422, an entry damaged before the bound existed is refused (409) for that account
  alone, every other account keeps its usual score and the breaker stays closed.
* Ids are text: ``5`` and ``"5"`` are one account; ``5.0`` and ``true`` are refused.
* A row dated inside the clock skew cannot lock its account's real-time rows; a 409's audit
  line carries the subject's hash.
* A terminal's rows are bounded in count as well as in time.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from infra.home import HomeLayout
from infra.online_state import ACCOUNT, TERMINAL, Journal
from infra.online_state.rocks import RocksStateStore
from solutions.fraud.online import OnlineFraudState, validate_rows
from tests.serve.fraud_helpers import FraudServer, TinyFraud, api_key, home_with_registry, train_tiny_fraud


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[HomeLayout, TinyFraud]:
    layout = HomeLayout(tmp_path_factory.mktemp("fraud-hostile-home"))
    return layout, train_tiny_fraud(layout)


def _row(tx: str, account: Any, when: str, amount: Any = 12.5, terminal: str = "T1") -> dict[str, Any]:
    return {"transaction_id": tx, "account_id": account, "timestamp": when, "amount": amount,
            "terminal_id": terminal}


def _post(client: httpx.Client, server: FraudServer, key: str, *rows: dict[str, Any]) -> httpx.Response:
    return client.post(f"{server.url}/v1/fraud/score", json={"transactions": list(rows)}, headers={"X-API-Key": key})


def _others() -> list[dict[str, Any]]:
    """Twelve ordinary transactions of six other accounts."""
    return [_row(f"o{i}", f"OK{i % 6}", f"2025-03-01T{10 + i // 6:02d}:{i:02d}:00", 10.0 + i, f"T{i % 3}")
            for i in range(12)]


def _breaker_open(server: FraudServer) -> bool:
    return any(slot.breaker.is_open for slot in server.app.state.serving.slots)


def test_the_four_request_outage_stays_with_the_poisoned_account(tiny: tuple[HomeLayout, TinyFraud],
                                                                 tmp_path: Path) -> None:
    src, _ = tiny
    reference_home = home_with_registry(src, tmp_path / "reference")
    with FraudServer(reference_home) as server, httpx.Client(timeout=60) as client:
        key = api_key(reference_home)
        usual = {}
        for row in _others():
            r = _post(client, server, key, row)
            assert r.status_code == 200, r.text
            usual[row["transaction_id"]] = r.json()["results"][0]["score"]

    home = home_with_registry(src, tmp_path / "attacked")
    # an account whose running sum an earlier version stored as null (inf): what the overflow left
    store = RocksStateStore(home.online_state() / "rocksdb")
    with store.exclusive():
        store.commit(Journal(accounts={"POISONED": {"n": 2, "sum": None, "terms": [], "seq": 0}}))
    store.close()
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        key = api_key(home)
        for i, amount in enumerate((1e308, 1.7e308)):  # the overflow itself: refused where it enters
            r = _post(client, server, key, _row(f"big{i}", "OVERFLOW", f"2025-03-01T09:0{i}:00", amount))
            assert r.status_code == 422, r.text
            assert r.json()["detail"]["column"] == "amount"
        for i in range(4):  # the four requests of the outage
            r = _post(client, server, key, _row(f"p{i}", "POISONED", f"2025-03-01T09:1{i}:00"))
            assert r.status_code == 409, r.text
            assert "reset" in r.json()["detail"]
        for row in _others():
            r = _post(client, server, key, row)
            assert r.status_code == 200, r.text
            assert abs(r.json()["results"][0]["score"] - usual[row["transaction_id"]]) <= 1e-9
        assert not _breaker_open(server)
        assert client.get(f"{server.url}/readyz").status_code == 200
        # the bound is the server's setting: an amount at it is accepted
        assert _post(client, server, key, _row("edge", "EDGE", "2025-03-01T12:00:00", 1e9)).status_code == 200


def test_ids_are_text_integers_canonicalised_floats_and_booleans_refused(tiny: tuple[HomeLayout, TinyFraud],
                                                                        tmp_path: Path) -> None:
    src, _ = tiny
    home = home_with_registry(src, tmp_path / "home")
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        key = api_key(home)
        assert _post(client, server, key, _row("a", 5, "2025-03-01T12:00:00")).status_code == 200
        # "5" is the same account as 5: its row an hour older is out of order
        assert _post(client, server, key, _row("b", "5", "2025-03-01T11:00:00")).status_code == 409
        for column, value in (("account_id", 5.0), ("account_id", True), ("transaction_id", 7.0),
                              ("terminal_id", False)):
            row = {**_row("c", "C", "2025-03-01T12:00:00"), column: value}
            r = _post(client, server, key, row)
            assert r.status_code == 422, (column, value, r.text)
            assert r.json()["detail"]["column"] == column


def test_a_row_inside_the_skew_window_cannot_lock_an_account(tiny: tuple[HomeLayout, TinyFraud],
                                                             tmp_path: Path) -> None:
    src, _ = tiny
    home = home_with_registry(src, tmp_path / "home")
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        key, attacker = api_key(home), api_key(home)
        ahead = (now + dt.timedelta(seconds=295)).isoformat(timespec="seconds")
        assert _post(client, server, attacker, _row("x", "VICTIM", ahead)).status_code == 200
        for i in range(10):  # the victim's real-time transactions
            when = (now + dt.timedelta(seconds=i)).isoformat(timespec="seconds")
            r = _post(client, server, key, _row(f"v{i}", "VICTIM", when))
            assert r.status_code == 200, r.text
        # a resend of a late row is recognised (answered as the first time), not applied twice
        resent = _post(client, server, key, _row("v3", "VICTIM", (now + dt.timedelta(seconds=3)).isoformat(
            timespec="seconds")))
        assert resent.status_code == 200 and resent.json().get("replayed") is True, resent.text
        # a row older than the latest by more than the tolerance is still out of order
        old = (now - dt.timedelta(hours=1)).isoformat(timespec="seconds")
        refused = _post(client, server, key, _row("late", "VICTIM", old))
        assert refused.status_code == 409, refused.text
        assert now.strftime("%H:%M") not in refused.text  # names no other transaction's time
    lines = [json.loads(line) for line in (home.serving() / "audit.jsonl").read_text().splitlines()]
    [conflict] = [a for a in lines if a.get("endpoint") == "/v1/fraud/score" and a.get("status") == 409]
    assert len(conflict["subjects"]) == 1  # the account, hashed
    assert "VICTIM" not in json.dumps(conflict)


def test_a_terminals_rows_are_bounded_in_count(tmp_path: Path) -> None:
    store = RocksStateStore(tmp_path / "state")
    state = OnlineFraudState(store, max_terminal_rows=50)
    start = pd.Timestamp("2025-03-01T00:00:00")
    records = [_row(f"t{i}", f"A{i % 7}", (start + pd.Timedelta(seconds=i)).isoformat(), 3.0, "BUSY")
               for i in range(300)]
    for chunk in range(0, 300, 60):
        with state.update() as batch:
            batch.apply(validate_rows(records[chunk : chunk + 60]), delay_days=7)
    stored = store.read(TERMINAL, ["BUSY"])["BUSY"]["rows"]
    assert len(stored) == 50
    assert [r[2] for r in stored] == [f"t{i}" for i in range(250, 300)]  # the newest kept
    assert store.read(ACCOUNT, ["A0"])["A0"]["n"] == 43
    # a terminal stored before the cap (184k rows took 0.5-1.4 s to read): the read is sized by the bound
    with store.exclusive():
        store.commit(Journal(terminal_rows=[("OLD", [i * 10**9, None, f"o{i}", i]) for i in range(500)]))
    with state.update() as batch:
        batch.load([], ["OLD"])
        assert [r[2] for r in batch.pending.terminals["OLD"]["rows"]] == [f"o{i}" for i in range(450, 500)]
    store.close()


def test_json_nested_about_a_thousand_deep_gets_a_4xx_on_every_fraud_route(tiny: tuple[HomeLayout, TinyFraud],
                                                                         tmp_path: Path) -> None:
    """Below orjson's 1,024 levels the body parses; the deep value then reached code that recursed."""
    src, _ = tiny
    home = home_with_registry(src, tmp_path / "home")
    bodies = {}
    for depth in (900, 990, 1000, 1020, 1100):
        deep_list, deep_obj = b"[" * depth + b"]" * depth, b'{"a": ' * depth + b"1" + b"}" * depth
        for name, deep in (("list", deep_list), ("object", deep_obj)):
            bodies[f"{depth}-{name}-top"] = b'{"transactions": ' + deep + b"}"
            bodies[f"{depth}-{name}-row"] = b'{"transactions": [' + deep + b"]}"
            bodies[f"{depth}-{name}-value"] = b'{"transactions": [{"account_id": ' + deep + b"}]}"
            bodies[f"{depth}-{name}-labels"] = b'{"labels": [{"label": ' + deep + b"}]}"
            bodies[f"{depth}-{name}-columns"] = b'{"transactions": [{}], "columns": ' + deep + b"}"
    with FraudServer(home) as server, httpx.Client(timeout=60) as client:
        key = api_key(home, "fraud:score", "fraud:label", "admin")
        headers = {"X-API-Key": key, "content-type": "application/json"}
        failures = []
        for name, body in bodies.items():
            for route in ("/v1/fraud/score", "/v1/fraud/labels", "/v1/fraud/state/reset"):
                r = client.post(f"{server.url}{route}", content=body, headers=headers)
                if not 400 <= r.status_code < 500:
                    failures.append((route, name, r.status_code))
        assert not failures, sorted({(r, n.split("-", 1)[1], c) for r, n, c in failures})
