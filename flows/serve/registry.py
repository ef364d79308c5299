"""``/v1/registry/approvals``: the alias moves that wait for a second person (four eyes), and
their decision, for teams that approve from their own tools instead of the Prefect UI.

Scope ``registry:approve`` (every model) or ``registry:approve:<model>``. The API key only carries
the decision: the decision itself is signed with the approver's own ed25519 key (``python -m
flows.registry sign``) and verified against the model's registry policy, so a key minted by anyone
who can write the home cannot approve by itself. A key bound to a person (``keys add --person``)
carries only that person's decisions. The signer must not be whoever started the run. Two racing
decisions: the second gets 409. The decision resumes the paused run exactly as the Prefect UI's form
does (:func:`tasks.approval.decide`) and is recorded in the registry trail with the key that
carried it; every refusal is in the audit log.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict

from infra.registry_policy import SignedDecision, same_person
from infra.serving.audit import record_audit
from infra.serving.auth import Principal, require_any_scope
from infra.serving.runtime import Services, Vertical
from tasks.approval import ApprovalRequest, ApprovalSummary

SCOPE = "registry:approve"
#: ApprovalError.code -> HTTP status
_STATUS = {"unknown": 404, "four_eyes": 403, "not_approver": 403, "signature": 403, "unapproved": 403,
           "decided": 409, "replayed": 409, "stale": 409, "gone": 502, "invalid": 422, "no_flow": 422,
           "no_policy": 422}
Approver = Annotated[Principal, Depends(require_any_scope(SCOPE))]


class ApprovalDecision(BaseModel):
    """The body of a decision: the decision signed with the approver's key."""

    model_config = ConfigDict(extra="forbid")

    signed_decision: SignedDecision


class ApprovalListView(BaseModel):
    approvals: list[ApprovalSummary]


def principal_name(principal: Principal) -> str:
    """How the trail names an API caller: the key, the person it is bound to, who made it."""
    name = principal.key_id if principal.key_id.startswith("jwt:") else f"api-key:{principal.key_id}"
    about = "; ".join(part for part in (principal.person, principal.created_by and f"made by {principal.created_by}")
                      if part)
    return f"{name} ({about})" if about else name


def may_approve(principal: Principal, model: str) -> bool:
    return principal.allows(SCOPE) or principal.allows(f"{SCOPE}:{model}")


def _view(request: ApprovalRequest) -> ApprovalSummary:
    """What a caller sees of a request: not where the run's Prefect API is, nor the refusals."""
    return ApprovalSummary.model_validate(request.model_dump(include=set(ApprovalSummary.model_fields)))


def build(services: Services) -> Vertical:
    """The registry's approval routes (always served: they need no model)."""
    router = APIRouter(tags=["registry"])

    @router.get("/v1/registry/approvals", response_model=ApprovalListView)
    async def approvals(principal: Approver) -> ApprovalListView:
        """The alias moves waiting for a decision that this key may carry, oldest first."""
        from tasks.approval import approval_requests

        waiting = await run_in_threadpool(approval_requests, "waiting", services.registry)
        return ApprovalListView(approvals=[_view(r) for r in waiting if may_approve(principal, r.model)])

    @router.post("/v1/registry/approvals/{run_id}", response_model=ApprovalSummary)
    async def decide_run(body: ApprovalDecision, request: Request, principal: Approver,
                         run_id: Annotated[str, Path(min_length=8, max_length=36)]) -> ApprovalSummary:
        """Give a signed decision to the alias move run ``run_id`` waits for. 404: no such run; 403: the
        key may not approve this model, is bound to another person, or the signature does not hold
        (not enrolled, edited, the initiator's); 409: already decided (or racing another decision);
        502: the run's Prefect API is gone."""
        from infra.errors import ApprovalError
        from tasks.approval import decide, find_request

        def refuse(status: int, message: str, model: str = "", version: int = 0) -> HTTPException:
            record_audit(request, model=model, model_version=version, rows=1, decisions={f"refused-{status}": 1})
            return HTTPException(status_code=status, detail={"error": message})

        try:
            found = await run_in_threadpool(find_request, run_id, services.registry)
        except ApprovalError as exc:
            raise refuse(_STATUS.get(exc.code, 422), str(exc)) from exc
        signer = body.signed_decision.statement.signer
        if not may_approve(principal, found.model):
            raise refuse(403, f"this credential lacks the scope {SCOPE}:{found.model}", found.model,
                         found.candidate_version)
        if principal.person is not None and not same_person(principal.person, signer):
            raise refuse(403, f"this key is bound to {principal.person}; it carries no decision signed by {signer}",
                         found.model, found.candidate_version)
        try:
            outcome = await run_in_threadpool(lambda: decide(found.run_id, signed=body.signed_decision,
                                                             via=principal_name(principal),
                                                             registry=services.registry))
        except ApprovalError as exc:
            raise refuse(_STATUS.get(exc.code, 422), str(exc), found.model, found.candidate_version) from exc
        record_audit(request, model=outcome.model, model_version=outcome.candidate_version, rows=1,
                     decisions={body.signed_decision.statement.decision: 1})
        return _view(outcome)

    return Vertical("registry", router)
