"""``fraud-evidence``: the served scores of a champion and its challenger (the serving API's score
log) joined to labels that arrived later; a better challenger is recommended and, with --promote,
the move waits for a second person's approval where the model needs it, then the champion moves
and the trail verifies."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prefect import get_client

from flows.fraud.evidence import fraud_evidence
from infra.home import home_layout
from infra.registry import ModelRegistry
from infra.serving.challenger import SCORES_DIR, ScoreLog, ScoreRecord
from tasks import approval
from tasks.approval import approval_requests, decide
from tasks.champion import set_challenger
from tests.approvers import enrol, statement_for

NAME = "evid-fraud"


def _served(n: int = 1200, seed: int = 0) -> None:
    """What the API records with a shadow challenger: v1's and v2's scores of n transactions, and labels."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.15).astype(int)
    ids = [f"evid-tx{i}" for i in range(n)]
    log = ScoreLog(home_layout().serving() / SCORES_DIR, flush_s=0.01)
    for version, role, lift in ((1, "champion", 0.5), (2, "challenger", 2.5)):
        scores = 1 / (1 + np.exp(-(lift * y + rng.normal(size=n))))
        log.record(ScoreRecord(model=NAME, version=version, role=role, ids=ids, scores=scores.tolist(),
                               decided=[role == "champion"] * n))
    half = n // 2  # two label sources (the chargeback feed and the fraud desk's key)
    log.record_labels(NAME, ids[:half], y[:half].tolist(), source="k-chargebacks")
    log.record_labels(NAME, ids[half:], y[half:].tolist(), source="k-fraud-desk")
    log.close()


def _paused(request: Any) -> bool:
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(uuid.UUID(request.run_id)).state
    return state is not None and state.is_paused()


def test_a_better_challenger_is_recommended_and_its_promotion_waits_for_approval(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    registry = ModelRegistry()
    for value in (0.3, 0.2):
        ref = registry.register(NAME, torch.nn.Linear(2, 1).state_dict(), params={}, metrics={"test/auprc": value},
                                primary_metric="test/auprc")
        if ref.version == 1:
            registry.promote(ref)
    set_challenger(f"{NAME}:2", registry=registry, reason="shadow")
    _served()

    report = fraud_evidence(model=NAME)  # no --promote: a recommendation only
    assert report.recommendation == "promote" and report.promotion is None
    assert [v.version for v in report.versions] == [1, 2] and report.paired.p_value < 0.05
    assert report.label_sources == {"k-chargebacks": 600, "k-fraud-desk": 600}
    assert registry.aliases(NAME)["champion"] == 1

    monkeypatch.setattr(approval, "APPROVAL_POLL_S", 1)
    people = enrol(registry, NAME, tmp_path / "keys")  # alice (this process: she starts the run) and bob
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(result=fraud_evidence(model=NAME, promote=True)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 90
    while not (waiting := [r for r in approval_requests("waiting") if r.model == NAME]) or not _paused(waiting[-1]):
        assert time.monotonic() < deadline and thread.is_alive(), "the promotion did not wait for approval"
        time.sleep(0.3)
    assert registry.aliases(NAME)["champion"] == 1 and waiting[-1].candidate_version == 2
    decide(waiting[-1].run_id, signed=statement_for(registry, NAME, 2, people["bob"], run_id=waiting[-1].run_id,
                                                    reason="online evidence reviewed"))
    thread.join(120)
    result = out["result"]
    assert result.promotion is not None and result.promotion.promoted
    assert result.promotion.approval.decided_by == "bob"
    assert registry.aliases(NAME)["champion"] == 2
    assert registry.verify_trail(NAME).ok
