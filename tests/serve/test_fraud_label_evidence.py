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
    """A label counts only for a transaction scored with that id under that account (a label naming a
    scored id under another account, or no account, is refused), and a transaction id names one
    transaction: a ``fraud:score`` key scoring a known id under another account gets 409, so it
    cannot add a second score of "the same" transaction to the evidence."""
    layout = HomeLayout(tmp_path / "home")
    train_tiny_fraud(layout)
    scorer = api_key(layout, serve_fraud.SCOPE)
    labeller = api_key(layout, serve_fraud.LABEL_SCOPE)
    row = {"transaction_id": "t1", "account_id": "A1", "timestamp": "2025-01-01T10:01:00", "amount": 6.0,
           "terminal_id": "T1"}
    with FraudServer(layout) as server, httpx.Client(timeout=60) as client:
        def score(rows: list[dict]) -> httpx.Response:
            return client.post(f"{server.url}/v1/fraud/score", json={"transactions": rows}, headers={"X-API-Key": scorer})

        scored = score([row])
        assert scored.status_code == 200, scored.text
        elsewhere = score([{**row, "account_id": "A2", "amount": 0.01}])  # the same id under another account
        assert elsewhere.status_code == 409 and "scored under another account" in elsewhere.text, elsewhere.text
        assert score([{**row, "account_id": "A2", "transaction_id": "t2"}]).status_code == 200  # its own id: fine
        refused = score([{**row, "account_id": "A3", "transaction_id": "t3", "amount": -1}])  # 422: ids not kept
        assert refused.status_code == 422
        assert score([{**row, "account_id": "A4", "transaction_id": "t3"}]).status_code == 200
        label = {"transaction_id": "t1", "account_id": "A1", "terminal_id": "T1", "timestamp": "2025-01-01T10:01:00",
                 "label": 1}
        labels = [label, {**label, "transaction_id": "never-scored", "timestamp": "2025-01-01T10:02:00"},
                  {**label, "account_id": "A2"}]  # t1 was never scored under A2
        sent = client.post(f"{server.url}/v1/fraud/labels", json={"labels": labels}, headers={"X-API-Key": labeller})
        assert sent.status_code == 200 and sent.json() == {"recorded": 1, "unknown": ["never-scored", "t1"]}
        bare = {k: v for k, v in label.items() if k != "account_id"}
        missing = client.post(f"{server.url}/v1/fraud/labels", json={"labels": [bare]},
                              headers={"X-API-Key": labeller})
        assert missing.status_code == 422 and missing.json()["detail"]["column"] == "account_id"
        deadline = time.monotonic() + 30
        while not [r for r in read_score_log(layout.serving() / SCORES_DIR, MODEL) if r["role"] == "label"]:
            assert time.monotonic() < deadline, "no label reached the score log"
            time.sleep(0.2)
        time.sleep(1)  # the writer flushes every 0.5 s
        logged = read_score_log(layout.serving() / SCORES_DIR, MODEL)
    assert [(r["id"], r["source"]) for r in logged if r["role"] == "label"] == [("t1", labeller.split("_")[1])]
    assert sorted(r["id"] for r in logged if r["role"] == "champion") == ["t1", "t2", "t3"]
