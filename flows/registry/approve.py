"""``registry-approve`` and ``registry-approvals``: decide a champion move a paused run waits for
(four eyes), and list the approvals asked for."""

from __future__ import annotations

from typing import Literal

from prefect import flow
from pydantic import BaseModel, ConfigDict

from infra.registry import current_actor
from tasks.approval import ApprovalRequest, approval_requests, decide_task


class ApprovalList(BaseModel):
    """``registry-approvals``: the approval requests asked for, oldest first."""

    model_config = ConfigDict(frozen=True)

    requests: list[ApprovalRequest]


@flow(name="registry-approve", log_prints=True)
def registry_approve(run: str, reason: str, reject: bool = False) -> ApprovalRequest:
    """Approve (or reject) the champion move a paused training run waits for, as this process's
    user (INDUSFLOW_GOVERNANCE_ACTOR, else the OS user), who must not be the one who started that
    run (four eyes). The run resumes as it would from the Prefect UI's approval form; the decision
    and its reason go into the registry trail.

    Args:
        run: the flow run id of the paused run (a unique prefix of 8 or more characters will do).
        reason: why (at least 3 characters); recorded in the registry trail.
        reject: reject the move instead: the champion stays.
    """
    return decide_task(run, approve=not reject, reason=reason, approver=current_actor())


@flow(name="registry-approvals", log_prints=True)
def registry_approvals(status: Literal["waiting", "approved", "rejected", "expired", "all"] = "waiting") -> ApprovalList:
    """List the champion moves that wait for approval (or, with --status, those approved, rejected
    or expired): run id, model, version, who asked and until when.

    Args:
        status: which requests to list (default: those waiting; all: every one).
    """
    return ApprovalList(requests=approval_requests(None if status == "all" else status))
