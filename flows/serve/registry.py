"""``/v1/registry/approvals``: the champion moves that wait for a second person (four eyes), and
their decision, for teams that approve from their own tools instead of the Prefect UI.

Scope ``registry:approve``. The approver is the caller's principal (``api-key:<key id>``, or
``jwt:<hash of the subject>``), never a name in the body, so a key cannot approve as someone
else; it must differ from whoever started the run. The decision resumes the paused run exactly
as the Prefect UI's form does (:func:`tasks.approval.decide`) and is recorded in the registry
trail.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from infra.serving.audit import record_audit
from infra.serving.auth import Principal, require_scope
from infra.serving.runtime import Services, Vertical
from tasks.approval import ApprovalRequest, ApprovalSummary

SCOPE = "registry:approve"
#: ApprovalError.code -> HTTP status
_STATUS = {"unknown": 404, "four_eyes": 403, "decided": 409, "gone": 502, "invalid": 422, "no_flow": 422}
Approver = Annotated[Principal, Depends(require_scope(SCOPE))]


class ApprovalDecision(BaseModel):
    """The body of a decision."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"decision": "approve", "reason": "card, comparison and lineage reviewed"}]})

    decision: Literal["approve", "reject"]
    reason: str = Field(min_length=3, max_length=2000, description="Why; recorded in the registry trail.")


class ApprovalListView(BaseModel):
    approvals: list[ApprovalSummary]


def principal_name(principal: Principal) -> str:
    """How the trail names an API caller."""
    return principal.key_id if principal.key_id.startswith("jwt:") else f"api-key:{principal.key_id}"


def _view(request: ApprovalRequest) -> ApprovalSummary:
    """What a caller sees of a request: not where the run's Prefect API is, nor the refusals."""
    return ApprovalSummary.model_validate(request.model_dump(include=set(ApprovalSummary.model_fields)))


def build(services: Services) -> Vertical:
    """The registry's approval routes (always served: they need no model)."""
    router = APIRouter(tags=["registry"])

    @router.get("/v1/registry/approvals", response_model=ApprovalListView)
    async def approvals(principal: Approver) -> ApprovalListView:
        """The champion moves waiting for a decision, oldest first."""
        from tasks.approval import approval_requests

        waiting = await run_in_threadpool(approval_requests, "waiting", services.registry)
        return ApprovalListView(approvals=[_view(r) for r in waiting])

    @router.post("/v1/registry/approvals/{run_id}", response_model=ApprovalSummary)
    async def decide_run(body: ApprovalDecision, request: Request, principal: Approver,
                         run_id: Annotated[str, Path(min_length=8, max_length=36)]) -> ApprovalSummary:
        """Approve or reject the champion move run ``run_id`` waits for, as this key (four eyes:
        not the run's initiator). 404: no such run; 403: the initiator; 409: already decided;
        502: the run's Prefect API is gone."""
        from infra.errors import ApprovalError
        from tasks.approval import decide

        try:
            outcome = await run_in_threadpool(lambda: decide(run_id, approve=body.decision == "approve",
                                                             reason=body.reason, approver=principal_name(principal),
                                                             registry=services.registry))
        except ApprovalError as exc:
            raise HTTPException(status_code=_STATUS.get(exc.code, 422), detail={"error": str(exc)}) from exc
        record_audit(request, model=outcome.model, model_version=outcome.candidate_version, rows=1,
                     decisions={body.decision: 1})
        return _view(outcome)

    return Vertical("registry", router)
