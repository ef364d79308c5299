"""Labels are evidence only for what was scored, and say who sent them: ``/v1/fraud/labels``
records a label in the score log (which the evidence flow reads) only for a transaction the
server scored, with the key that sent it."""

from __future__ import annotations

import time

import httpx

from flows.serve import fraud as serve_fraud
from infra.home import HomeLayout
from infra.serving.challenger import SCORES_DIR, read_score_log
from tests.serve.fraud_helpers import MODEL, FraudServer, api_key, train_tiny_fraud


def test_labels_are_kept_only_for_scored_transactions_with_their_sender(tmp_path) -> None:
    layout = HomeLayout(tmp_path / "home")
    train_tiny_fraud(layout)
    scorer = api_key(layout, serve_fraud.SCOPE)
    labeller = api_key(layout, serve_fraud.LABEL_SCOPE)
    row = {"transaction_id": "t1", "account_id": "A1", "timestamp": "2025-01-01T10:01:00", "amount": 6.0,
           "terminal_id": "T1"}
    with FraudServer(layout) as server, httpx.Client(timeout=60) as client:
        scored = client.post(f"{server.url}/v1/fraud/score", json={"transactions": [row]},
                             headers={"X-API-Key": scorer})
        assert scored.status_code == 200, scored.text
        labels = [{"transaction_id": "t1", "terminal_id": "T1", "timestamp": "2025-01-01T10:01:00", "label": 1},
                  {"transaction_id": "never-scored", "terminal_id": "T1", "timestamp": "2025-01-01T10:02:00",
                   "label": 1}]
        sent = client.post(f"{server.url}/v1/fraud/labels", json={"labels": labels}, headers={"X-API-Key": labeller})
        assert sent.status_code == 200 and sent.json()["unknown"] == ["never-scored"]
        deadline = time.monotonic() + 30
        while not (got := [r for r in read_score_log(layout.serving() / SCORES_DIR, MODEL) if r["role"] == "label"]):
            assert time.monotonic() < deadline, "no label reached the score log"
            time.sleep(0.2)
    assert [(r["id"], r["source"]) for r in got] == [("t1", labeller.split("_")[1])]
