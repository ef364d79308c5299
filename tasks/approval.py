"""Approval before an alias move: a decision signed by a second person (four eyes).

A model needs approval when its registry policy says so (:mod:`infra.registry_policy`: the
approvers and their ed25519 public keys), and the registry refuses any alias move of such a model
without a valid signed decision, whatever process asks. ``INDUSFLOW_GOVERNANCE_APPROVAL_REQUIRED``
and the deployment config's ``approval:`` block can only add the requirement: a model they name
with no policy fails with a message saying to enrol approvers. The champion rule then only decides
(:meth:`~infra.registry.ModelRegistry.promote` with ``decide_only``) and :func:`approval_gate` pauses
the flow run (Prefect's ``pause_flow_run`` with :class:`ApprovalInput`). The Prefect UI shows the
comparison and the card (with its lineage) above a form whose one field is the signed decision;
``python -m flows.<vertical> approve RUN --key PATH`` signs it with the approver's own key and
resumes the run (Prefect's ``resume_flow_run``, as the UI does), and ``POST
/v1/registry/approvals/RUN`` carries one signed elsewhere.

Identity comes from the signature alone: the run verifies it against the policy (an enrolled key,
this model, version, alias, files and run, recent) and refuses a signer who is the initiator (the
run's Prefect user where the server has users, else the OS account of the process that started
it; a policy lists the accounts that are each approver). No name in a form, a run input or an
environment variable is trusted. A refused decision is recorded and the run pauses again. No
decision within ``INDUSFLOW_GOVERNANCE_APPROVAL_TIMEOUT_S`` rejects the move and the run completes.
Two decisions racing for one run: the first claims it (compare-and-set), the second is refused
as already decided. Every request, refusal, decision and expiry is an entry of the registry trail.

While a run waits, ``registry/<name>/approvals/<run id>.json`` says who asked, for what (the files'
hashes an approver signs), until when, and where the run's Prefect API is, so ``approve`` reaches
a run that started its own temporary API (no server).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from prefect import task
from prefect.cache_policies import NONE
from prefect.input import RunInput
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.errors import ApprovalError, QualityGateError, RegistryError
from infra.registry import (
    CHAMPION,
    Approval,
    ChampionComparison,
    ModelRef,
    ModelRegistry,
    PromotionDecision,
    current_actor,
)
from infra.registry_policy import (
    DecisionStatement,
    SignedDecision,
    load_signing_key,
    now_iso,
    public_key_of,
    sign_decision,
)
from infra.settings import get_governance_settings
from infra.store import check_name, safe_join, write_json_atomic
from tasks.register import RegistrationResult, render_promotion

log = logging.getLogger(__name__)

APPROVALS_DIR = "approvals"
#: Seconds between a waiting run's checks for the decision: a person's decision needs no faster answer, and
#: each check is one Prefect API read (the tests set 1).
APPROVAL_POLL_S = 2
_RUN_ID = re.compile(r"^[0-9a-f][0-9a-f-]{7,35}$")
Status = Literal["waiting", "approved", "rejected", "expired"]


class ApprovalInput(RunInput):
    """The approval form a paused run shows in the Prefect UI (and the input ``approve`` sends): the
    signed decision only; who decided is whoever's enrolled key signed it."""

    signed_decision: str = Field(
        min_length=2, max_length=20_000,
        description="The decision signed with your approver key, as JSON (python -m flows.registry sign RUN "
        "--key PATH --reason ... prints it). It must not be signed by whoever started the run (four eyes).")
    via: str | None = Field(default=None, max_length=200,
                            description="The channel that carried it (set by the API: the key id); informative only.")


class ApprovalSummary(BaseModel):
    """A champion move waiting for (or given) a decision, as the API shows it."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    model: str
    candidate_version: int
    champion_version: int | None
    metric: str
    candidate_value: float | None
    champion_value: float | None
    rule: str = Field(description="What the champion rule said.")
    requested_by: str
    requested_at: str
    expires_at: str
    status: Status = "waiting"
    decided_by: str | None = None
    decision_reason: str | None = None
    decided_at: str | None = None


class ApprovalRequest(ApprovalSummary):
    """The whole request file: ``registry/<name>/approvals/<run id>.json``."""

    alias: str = Field(default=CHAMPION, description="The alias the approved move points at the candidate.")
    files: dict[str, str] = Field(default_factory=dict, description="SHA-256 of the candidate's files, as its "
                                  "registration recorded them: what an approver signs.")

    flow_run_name: str
    flow_name: str
    api_url: str | None = Field(description="The Prefect API the run talks to (None: unknown).")
    refused: list[str] = Field(default_factory=list, description="Decisions refused (four eyes), oldest first.")


def approval_required(name: str, registry: ModelRegistry | None = None) -> bool:
    """Whether ``name``'s alias moves wait for a signed approval: its registry policy says so.

    Raises:
        ApprovalError: the settings or the deployment config ask for approval of ``name`` but its
            registry policy enrols no approver (nobody could approve: enrol them first).
    """
    from infra.deploy_config import load_deploy_config

    registry = registry or ModelRegistry()
    policy = registry.policy(name) if name in registry.models() else None
    if policy is not None:
        return policy.approval_required
    listed = get_governance_settings().approval_required
    if "*" in listed or name in listed or load_deploy_config().approval.get(name) == "required":
        raise ApprovalError(f"{name} needs approval (INDUSFLOW_GOVERNANCE_APPROVAL_REQUIRED or the deployment "
                            "config) but its registry policy enrols no approver: enrol them with python -m "
                            f"flows.registry policy --model {name} ...", code="no_policy")
    return False


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ------------------------------------------------------------------------------------
# the request files


def _request_path(registry: ModelRegistry, model: str, run_id: str) -> Path:
    return safe_join(registry.root, check_name(model, "model name"), APPROVALS_DIR, f"{run_id}.json")


def _write(registry: ModelRegistry, request: ApprovalRequest) -> ApprovalRequest:
    path = _request_path(registry, request.model, request.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, request.model_dump())
    return request


def _read(registry: ModelRegistry, model: str, run_id: str) -> ApprovalRequest:
    return ApprovalRequest.model_validate_json(_request_path(registry, model, run_id).read_text())


def approval_requests(status: Status | None = None, registry: ModelRegistry | None = None) -> list[ApprovalRequest]:
    """Every approval request of every model (with ``status``: only those), oldest first. A request
    still ``waiting`` past its ``expires_at`` counts as ``expired``: its run is gone (killed before
    it could record the expiry) or about to reject it."""
    registry = registry or ModelRegistry()
    now = _now().isoformat()
    found = []
    for model in registry.models():
        folder = safe_join(registry.root, model, APPROVALS_DIR)
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                request = ApprovalRequest.model_validate_json(path.read_text())
            except (OSError, ValueError) as exc:
                log.warning("skipped approval request %s: %s", path.name, exc)
                continue
            if request.status == "waiting" and request.expires_at < now:
                request = request.model_copy(update={"status": "expired",
                                                     "decision_reason": "no decision before it expired"})
            if status is None or request.status == status:
                found.append(request)
    return sorted(found, key=lambda r: r.requested_at)


def find_request(run_id: str, registry: ModelRegistry | None = None) -> ApprovalRequest:
    """The request of flow run ``run_id`` (a unique prefix of at least 8 characters will do)."""
    key = run_id.strip().lower()
    if not _RUN_ID.match(key):
        raise ApprovalError(f"{run_id!r} is not a flow run id (8-36 hex digits and dashes)")
    requests = approval_requests(registry=registry)
    matches = [r for r in requests if r.run_id.startswith(key)]
    if not matches:
        waiting = [f"{r.run_id} ({r.model} v{r.candidate_version})" for r in requests if r.status == "waiting"]
        raise ApprovalError(f"no approval was asked in run {run_id!r}; waiting: {', '.join(waiting) or 'none'}",
                            code="unknown")
    if len({r.run_id for r in matches}) > 1:
        raise ApprovalError(f"{run_id!r} matches {len(matches)} runs: give more of the run id")
    return matches[-1]


# ------------------------------------------------------------------------------------
# inside the run that waits


def run_initiator(flow_run: Any) -> str:
    """Who started ``flow_run``: its Prefect user where the server records one, else this process's actor."""
    created = getattr(flow_run, "created_by", None)
    if created is not None and str(getattr(created, "type", "")).upper() == "USER" and created.display_value:
        return str(created.display_value)
    return current_actor()


def _api_url() -> str | None:
    from prefect import get_client

    try:
        with get_client(sync_client=True) as client:
            return str(client.api_url)
    except Exception as exc:  # noqa: BLE001 - the request works without it (approve then needs PREFECT_API_URL)
        log.info("the Prefect API URL of this run is unknown: %s", exc)
        return None


def _cli_hint(flow_name: str, run_id: str) -> str:
    vertical = flow_name.split("-", 1)[0]
    module = f"flows.{vertical}" if vertical in ("fraud", "sensor") else "flows.registry"
    return f'python -m {module} approve {run_id} --key YOUR_KEY.pem --reason "..." (or --reject)'


def approval_markdown(ref: ModelRef, decision: PromotionDecision, hint: str, requested_by: str,
                      expires: dt.datetime, alias: str = CHAMPION) -> str:
    """What the approver reads: the request, the comparison, then the card (with its lineage)."""
    card = Path(ref.path) / "card.md"
    lines = [f"# Approve {ref.name} v{ref.version} as {alias}?", "",
             (f"Requested by **{requested_by}**; an enrolled approver other than them must sign the decision "
              f"(four eyes). Without a decision by {expires:%Y-%m-%d %H:%M} UTC the move is rejected."), "",
             (f"Decide with `{hint}`, or paste the output of `python -m flows.registry sign` here, or "
              "`POST /v1/registry/approvals/<run id>` with the signed decision."),
             "", render_promotion(decision)]
    lines += ["", card.read_text()] if card.is_file() else ["", "(No model card was written for this version.)"]
    return "\n".join(lines)


def _expire_pause(run_id: uuid.UUID) -> None:
    """After a pause timed out: put the run back to Running so it completes (a rejection is not a
    failed run); Prefect would otherwise fail it as 'never resumed'."""
    from prefect import get_client
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Running(), force=True)


def parse_signed(text: str) -> SignedDecision:
    """A signed decision from its JSON (ApprovalError ``invalid`` naming the problem)."""
    try:
        return SignedDecision.model_validate_json(text)
    except ValidationError as exc:
        raise ApprovalError("the signed decision is not valid: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])) from None


def _check_answer(registry: ModelRegistry, request: ApprovalRequest, answer: ApprovalInput,
                  initiators: list[str]) -> tuple[SignedDecision, str]:
    """The signed decision of a form and its verified signer (ApprovalError when it does not hold)."""
    signed = parse_signed(answer.signed_decision)
    signer = registry.verify_decision(request.model, request.alias, request.candidate_version, signed,
                                      initiators=initiators, run_id=request.run_id)
    return signed, signer


def await_approval(registry: ModelRegistry, ref: ModelRef, decision: PromotionDecision,
                   alias: str = CHAMPION) -> Approval:
    """Pause the current flow run until an enrolled approver other than its initiator signs a decision
    on pointing ``alias`` at ``ref`` (or the timeout rejects it); every step is in the registry trail."""
    from prefect.context import FlowRunContext
    from prefect.exceptions import FlowPauseTimeout
    from prefect.flow_runs import pause_flow_run

    from tasks.evaluate import artifact_key, publish_eval_report

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        raise ApprovalError(f"{ref.spec} needs approval before {ref.name}@{alias} moves: run it as a flow (the run "
                            "pauses for the decision)", code="no_flow")
    settings = get_governance_settings()
    run = context.flow_run
    run_id = str(run.id)
    requested_by = run_initiator(run)
    initiators = [requested_by, current_actor()]
    started, deadline = _now(), time.monotonic() + settings.approval_timeout_s
    expires = started + dt.timedelta(seconds=settings.approval_timeout_s)
    hint = _cli_hint(context.flow.name, run_id)
    request = _write(registry, ApprovalRequest(
        run_id=run_id, flow_run_name=run.name, flow_name=context.flow.name, model=ref.name, alias=alias,
        candidate_version=ref.version, champion_version=decision.champion_version, metric=decision.metric,
        candidate_value=decision.candidate_value, champion_value=decision.champion_value, rule=decision.reason,
        requested_by=requested_by, requested_at=started.isoformat(), expires_at=expires.isoformat(),
        api_url=_api_url(), files=registry.version_files(ref.name, ref.version)))
    registry.record_event(ref.name, "approval-requested", candidate=ref.version, champion=decision.champion_version,
                          reason=decision.reason, by=requested_by, run_id=run_id, extra={"for_alias": alias})
    markdown = approval_markdown(ref, decision, hint, requested_by, expires, alias)
    publish_eval_report(markdown, key=artifact_key(f"{ref.name}-approval"),
                        description=f"{ref.spec} waits for approval as {alias}")
    log.info("%s waits for approval as %s (run %s, requested by %s): %s; rejected without a decision by %s UTC",
             ref.spec, alias, run_id, requested_by, hint, f"{expires:%Y-%m-%d %H:%M}")
    form = ApprovalInput.with_initial_data(description=markdown)
    attempt = 0
    while True:
        remaining = math.ceil(deadline - time.monotonic())
        answer = None
        if remaining > 0:
            try:
                answer = pause_flow_run(wait_for_input=form, timeout=remaining,
                                        poll_interval=min(APPROVAL_POLL_S, remaining),
                                        key=f"approval-{ref.name}-{ref.version}-{attempt}")
            except FlowPauseTimeout:
                _expire_pause(run.id)
        if answer is None:
            why = f"no decision within {settings.approval_timeout_s} s"
            registry.record_event(ref.name, "approval-expired", candidate=ref.version,
                                  champion=decision.champion_version, reason=why, by=current_actor(), run_id=run_id)
            now = _now().isoformat()
            _write(registry, request.model_copy(update={"status": "expired", "decision_reason": why, "decided_at": now}))
            log.info("%s: %s; %s stays", ref.spec, why, alias)
            return Approval(run_id=run_id, requested_by=requested_by, decided_by=None, approved=False, reason=why,
                            requested_at=request.requested_at, decided_at=now)
        try:
            signed, signer = _check_answer(registry, request, answer, initiators)
        except (ApprovalError, RegistryError) as exc:
            why = f"refused: {exc}"
            registry.record_event(ref.name, "approval-refused", candidate=ref.version,
                                  champion=decision.champion_version, reason=why, by="(unverified)", run_id=run_id,
                                  extra={"via": answer.via})
            request = _write(registry, request.model_copy(update={"refused": [*request.refused, why]}))
            log.warning("%s: a decision was refused (%s); waiting again", ref.spec, exc)
            attempt += 1
            continue
        statement = signed.statement
        approved = statement.decision == "approve"
        registry.record_event(ref.name, "approved" if approved else "rejected", candidate=ref.version,
                              champion=decision.champion_version, reason=statement.reason, by=signer, run_id=run_id,
                              extra={"decision_sha256": signed.sha256, "signer_key": signed.public_key,
                                     "signed": signed.model_dump(mode="json"), "for_alias": alias,
                                     "via": answer.via})
        now = _now().isoformat()
        _write(registry, request.model_copy(update={
            "status": "approved" if approved else "rejected", "decided_by": signer,
            "decision_reason": statement.reason, "decided_at": now}))
        log.info("%s %s by %s: %s", ref.spec, "approved" if approved else "rejected", signer, statement.reason)
        return Approval(run_id=run_id, requested_by=requested_by, decided_by=signer, approved=approved,
                        reason=statement.reason, requested_at=request.requested_at, decided_at=now, signed=signed,
                        via=answer.via)


def approval_gate(registration: RegistrationResult, *, strict: bool = False, force: bool = False,
                  move: Callable[[Approval], PromotionDecision] | None = None,
                  alias: str = CHAMPION) -> RegistrationResult:
    """When the champion rule's win waits for approval (``decision.awaiting_approval``): pause for
    the decision, then move the champion (the rule applied again inside the lock) or record the
    rejection; refresh the version's card with the outcome. Other registrations pass through.

    Args:
        strict: raise :class:`~infra.errors.QualityGateError` when the move is rejected.
        force: a promotion by hand (the move ignores the metrics once approved).
        move: makes the approved move instead of a promotion (a rollback, a challenger); gets the approval.
        alias: the alias the approved move points at the candidate (what the approver signs).
    """
    decision = registration.decision
    if not decision.awaiting_approval:
        return registration
    from tasks.cards import publish_card, read_card, write_card
    from tasks.evaluate import artifact_key, publish_eval_report

    registry = ModelRegistry()
    ref = registration.model
    approval = await_approval(registry, ref, decision, alias)
    if approval.approved and move is not None:
        final = move(approval)
    elif approval.approved:
        comparison = (ChampionComparison(champion_version=decision.champion_version,
                                         champion_value=decision.champion_value, p_value=decision.p_value)
                      if decision.champion_version is not None else None)
        final = registry.promote(ref, comparison=comparison, alpha=decision.alpha, force=force, approval=approval)
    else:
        who = f"rejected by {approval.decided_by}" if approval.decided_by else "rejected"
        final = decision.model_copy(update={
            "awaiting_approval": False, "approval": approval, "reason": f"{decision.reason}; {who}: {approval.reason}",
            "trail_sha256": registry.trail_head(ref.name)})
    card = read_card(ref)
    if card is not None:
        publish_card(write_card(registry, ref, card.model_copy(update={"promotion": final.model_dump()})), ref.name)
    markdown = render_promotion(final)
    if registration.lineage is not None:
        from tasks.lineage import render_lineage

        markdown += "\n" + render_lineage(registration.lineage)
    publish_eval_report(markdown, key=artifact_key(f"{ref.name}-promotion"),
                        description="Champion rule and approval: challenger vs champion on the same test data")
    if strict and not final.promoted:
        raise QualityGateError(f"{ref.spec} not promoted: {final.reason}")
    return registration.model_copy(update={"decision": final, "model": registry.get(ref.name, ref.version)})


approval_gate_task = task(approval_gate, name="approval-gate", cache_policy=NONE,
                          description="Wait for a second person's approval of a champion move, then move it or not.")


# ------------------------------------------------------------------------------------
# deciding from outside the run (CLI, API)


@contextlib.contextmanager
def _prefect_api(url: str | None) -> Iterator[None]:
    """Talk to the Prefect API at ``url`` (the waiting run's) unless this process already does."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if url is None or PREFECT_API_URL.value() == url:
        yield
        return
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def sign_for_request(run_id: str, *, approve: bool, reason: str, key_path: Path,
                     registry: ModelRegistry | None = None) -> SignedDecision:
    """The decision on the move run ``run_id`` waits for, signed with the approver's private key in
    ``key_path``; the signer's name is the policy's person of that key."""
    registry = registry or ModelRegistry()
    request = find_request(run_id, registry)
    key = load_signing_key(key_path)
    policy = registry.policy(request.model)
    approver = policy.approver(public_key_of(key)) if policy is not None else None
    if approver is None:
        raise ApprovalError(f"the key in {key_path} is not enrolled as an approver of {request.model}",
                            code="not_approver")
    try:
        statement = DecisionStatement(model=request.model, version=request.candidate_version, alias=request.alias,
                                      files=request.files, run_id=request.run_id,
                                      decision="approve" if approve else "reject", reason=reason.strip(),
                                      signer=approver.person, at=now_iso())
    except ValidationError as exc:
        raise ApprovalError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    return sign_decision(key, statement)


def _claim(registry: ModelRegistry, request: ApprovalRequest) -> Path:
    """Compare-and-set: the first decision on this attempt of the run creates its claim file; a
    second one is refused as already decided (``code="decided"``)."""
    path = _request_path(registry, request.model, request.run_id).with_suffix(f".claim-{len(request.refused)}")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise ApprovalError(f"{request.model} v{request.candidate_version}: another decision was given a moment ago",
                            code="decided") from None
    return path


def decide(run_id: str, *, signed: SignedDecision, via: str | None = None, wait_s: float = 60.0,
           registry: ModelRegistry | None = None) -> ApprovalRequest:
    """Give the signed decision ``signed`` to the move run ``run_id`` waits for: checks it against the
    model's policy (refusals recorded in the trail), claims the decision (the first of two racing
    ones wins), resumes the paused run with it (as the Prefect UI does) and waits up to ``wait_s``
    for the run to record the outcome. Returns the request as it then stands.

    Raises:
        ApprovalError: no such waiting run, a signature that does not hold or a signer who started
            the run (``four_eyes``; recorded), already decided, or a run whose Prefect API is gone.
    """
    import httpx
    from prefect.exceptions import FlowPauseTimeout, NotPausedError, ObjectNotFound
    from prefect.flow_runs import resume_flow_run

    registry = registry or ModelRegistry()
    request = find_request(run_id, registry)

    def refuse(exc: ApprovalError) -> ApprovalError:
        """``exc`` recorded on the trail (with the decision it refused), to be raised."""
        registry.record_event(request.model, "approval-refused", candidate=request.candidate_version,
                              champion=request.champion_version, reason=f"refused: {exc}", by="(unverified)",
                              run_id=request.run_id, extra={"via": via, "refused_code": exc.code,
                                                            "decision_sha256": signed.sha256})
        return ApprovalError(f"run {request.run_id}: {exc}", code=exc.code)

    if request.status != "waiting":
        by = f" by {request.decided_by}" if request.decided_by else ""
        raise refuse(ApprovalError(f"{request.model} v{request.candidate_version} was already {request.status}{by} "
                                   f"at {request.decided_at}", code="decided"))
    try:
        registry.verify_decision(request.model, request.alias, request.candidate_version, signed,
                                 initiators=[request.requested_by], run_id=request.run_id)
        claim = _claim(registry, request)
    except ApprovalError as exc:
        raise refuse(exc) from None
    answer = ApprovalInput(signed_decision=signed.model_dump_json(), via=via)
    try:
        with _prefect_api(request.api_url):
            resume_flow_run(uuid.UUID(request.run_id), run_input=json.loads(answer.model_dump_json()))
    except ObjectNotFound:
        raise ApprovalError(f"run {request.run_id} is not known to the Prefect API at {request.api_url}",
                            code="gone") from None
    except NotPausedError:
        raise refuse(ApprovalError("the run is not paused: it finished, or another decision resumed it a moment "
                                   "ago", code="decided")) from None
    except FlowPauseTimeout:
        raise ApprovalError(f"run {request.run_id}: its wait for approval timed out", code="decided") from None
    except RuntimeError as exc:  # a resume the server rejected (e.g. the input): the claim is released
        claim.unlink(missing_ok=True)
        raise ApprovalError(f"run {request.run_id} cannot be resumed: {exc}") from None
    except (OSError, httpx.TransportError) as exc:  # connection refused, timed out: nobody serves that API
        raise ApprovalError(f"the Prefect API of run {request.run_id} ({request.api_url}) does not answer: the run "
                            f"is gone with its process ({exc})", code="gone") from None
    deadline = time.monotonic() + wait_s
    current = request
    while time.monotonic() < deadline:
        current = _read(registry, request.model, request.run_id)
        if current.status != "waiting" or len(current.refused) > len(request.refused):
            break
        time.sleep(0.25)
    return current


decide_task = task(decide, name="decide-approval", cache_policy=NONE,
                   description="Give a signed decision to the alias move a paused run waits for (four eyes).")
