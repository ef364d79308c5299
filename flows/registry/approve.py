"""``registry-approve``, ``registry-sign`` and ``registry-approvals``: decide an alias move a paused
run waits for with the approver's own signing key (four eyes), and list the approvals asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect import flow
from pydantic import BaseModel, ConfigDict

from infra.registry_policy import SignedDecision
from tasks.approval import ApprovalRequest, approval_requests, decide_task, sign_for_request


class ApprovalList(BaseModel):
    """``registry-approvals``: the approval requests asked for, oldest first."""

    model_config = ConfigDict(frozen=True)

    requests: list[ApprovalRequest]


@flow(name="registry-approve", log_prints=True)
def registry_approve(run: str, reason: str, key: str, reject: bool = False) -> ApprovalRequest:
    """Approve (or reject) the alias move a paused run waits for: the decision is signed with your
    approver key (enrolled in the model's registry policy), and counts only when that key is not
    the one of whoever started the run (four eyes). No user name or environment variable names the
    approver: the signature does. The run resumes as it would from the Prefect UI's form; the
    decision and its reason go into the registry trail.

    Args:
        run: the flow run id of the paused run (a unique prefix of 8 or more characters will do).
        reason: why (at least 3 characters); recorded in the registry trail.
        key: path of your ed25519 private key (python -m flows.registry keygen); it never leaves this process.
        reject: reject the move instead: the alias stays.
    """
    signed = sign_for_request(run, approve=not reject, reason=reason, key_path=Path(key).expanduser())
    return decide_task(run, signed=signed, via="cli")


def sign_decision_for(run: str, reason: str, key: str, reject: bool = False) -> SignedDecision:
    """The signed decision ``registry-sign`` prints: what the command calls without a Prefect API,
    since it only reads the registry's request and policy files."""
    return sign_for_request(run, approve=not reject, reason=reason, key_path=Path(key).expanduser())


@flow(name="registry-sign", log_prints=True)
def registry_sign(run: str, reason: str, key: str, reject: bool = False) -> SignedDecision:
    """Sign a decision on the alias move a paused run waits for, without sending it: paste the JSON
    into the run's approval form in the Prefect UI, or POST it to /v1/registry/approvals/RUN.

    Args:
        run: the flow run id of the paused run (a unique prefix of 8 or more characters will do).
        reason: why (at least 3 characters); recorded in the registry trail.
        key: path of your ed25519 private key (python -m flows.registry keygen).
        reject: sign a rejection instead.
    """
    return sign_decision_for(run, reason, key, reject)


ListStatus = Literal["waiting", "approved", "rejected", "expired", "all"]


def list_approvals(status: ListStatus = "waiting") -> ApprovalList:
    """The approval requests with ``status`` (read from the registry's files): what the
    ``registry-approvals`` flow returns, and what ``approvals`` prints without a Prefect API."""
    return ApprovalList(requests=approval_requests(None if status == "all" else status))


@flow(name="registry-approvals", log_prints=True)
def registry_approvals(status: ListStatus = "waiting") -> ApprovalList:
    """List the alias moves that wait for approval (or, with --status, those approved, rejected
    or expired): run id, model, version, who asked and until when.

    Args:
        status: which requests to list (default: those waiting; all: every one).
    """
    return list_approvals(status)
