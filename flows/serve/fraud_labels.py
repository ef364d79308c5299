"""``POST /v1/fraud/labels`` and ``POST /v1/fraud/state/reset``: what changes the fraud online state
besides scoring (:mod:`flows.serve.fraud`). Labels that became known feed later transactions'
delayed terminal risk and the evidence flow; an admin may forget one account's or terminal's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import DataValidationError
from infra.serving.audit import record_audit
from infra.serving.auth import ADMIN, Principal, require_scope
from infra.serving.quotas import check_rows
from solutions.fraud import schema as S

if TYPE_CHECKING:
    from flows.serve.fraud import FraudPredictor
    from infra.serving.model_route import ModelRoute

LABEL_SCOPE = "fraud:label"


class FraudLabelRequest(BaseModel):
    """Labels that became known after scoring (chargebacks, investigations)."""

    labels: list[dict[str, Any]] = Field(
        min_length=1,
        description="One object per transaction: transaction_id, account_id, terminal_id, timestamp (as scored), "
        "label (0/1). A label counts only for a transaction scored with that id under that account.",
        examples=[[{"transaction_id": "tx-1001", "account_id": "A17", "terminal_id": "T9",
                    "timestamp": "2025-02-27T14:03:11", "label": 1}]],
    )
    columns: dict[str, str] | None = Field(default=None, description="Column mapping canonical -> source name.")


class FraudLabelResponse(BaseModel):
    """How many labels were recorded; the ids the state does not hold."""

    recorded: int
    unknown: list[str] = Field(description="Transaction ids never scored under the account given, or older than the "
                               "terminal windows keep.")


class FraudStateReset(BaseModel):
    """Which online state to forget: one account's, or one terminal's."""

    model_config = ConfigDict(extra="forbid")

    account_id: str | None = Field(default=None, min_length=1, max_length=128, examples=["A17"])
    terminal_id: str | None = Field(default=None, min_length=1, max_length=128)


class FraudStateResetResponse(BaseModel):
    """What was reset."""

    kind: str = Field(description="account or terminal")
    found: bool = Field(description="False when the state held nothing for it.")


def _label_value(value: Any) -> int | None:
    """A label as validated by ``apply_labels`` (0/1, a number or its text), as an int."""
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def add_label_route(router: APIRouter, fraud: FraudPredictor, route: ModelRoute[Any, Any, Any]) -> None:
    """``POST /v1/fraud/labels``."""

    @router.post("/v1/fraud/labels", response_model=FraudLabelResponse)
    async def labels(body: FraudLabelRequest, request: Request,
                     principal: Annotated[Principal, Depends(require_scope(LABEL_SCOPE))]) -> FraudLabelResponse:
        """Record known labels: later transactions' delayed terminal risk counts them, as in the batch path,
        and the evidence flow (``python -m flows.fraud evidence``) joins them to each version's served scores."""
        from solutions.fraud.online import apply_labels

        check_rows(request, len(body.labels))
        mine = await owned_rows(fraud, body)
        rows = [row for row, ok in zip(body.labels, mine, strict=True) if ok]
        try:
            missing = set(await run_in_threadpool(apply_labels, fraud.state(), rows, body.columns) if rows else [])
        except DataValidationError as exc:
            raise HTTPException(status_code=422, detail={"error": str(exc), "column": exc.column,
                                                         "rows": exc.rows}) from exc
        except ValueError as exc:
            raise HTTPException(status_code=422, detail={"error": str(exc)}) from exc
        id_col = (body.columns or {}).get(S.TRANSACTION_ID, S.TRANSACTION_ID)
        label_col = (body.columns or {}).get(S.LABEL, S.LABEL)
        # in request order: not scored under that account, or not in the state
        unknown = [str(r.get(id_col)) for r, ok in zip(body.labels, mine, strict=True)
                   if not ok or str(r.get(id_col)) in missing]
        known = [(str(r.get(id_col)), _label_value(r.get(label_col))) for r in rows]
        unscored = {str(tx) for tx in missing}  # evidence only for transactions this server scored
        known = [(tx, label) for tx, label in known if label is not None and tx not in unscored]
        fraud.services.scores.record_labels(fraud.model_name, [tx for tx, _ in known], [label for _, label in known],
                                            source=principal.key_id)
        record_audit(request, model=fraud.model_name, model_version=route.slot.version or 0, rows=len(body.labels),
                     decisions={"recorded": len(body.labels) - len(unknown), "unknown": len(unknown)})
        return FraudLabelResponse(recorded=len(body.labels) - len(unknown), unknown=unknown)


async def owned_rows(fraud: FraudPredictor, body: FraudLabelRequest) -> list[bool]:
    """Per label, whether its transaction was scored under the account it names (a row without a
    readable id goes on to the validation, which names it: 422); 422 when a row names no account."""
    pairs = fraud.id_pairs(body.labels, body.columns)
    no_account = [i for i, (_, who) in enumerate(pairs) if who is None]
    if no_account:
        raise HTTPException(status_code=422, detail={
            "error": f"{S.ACCOUNT_ID} is required: a label counts only for the transaction scored with that id "
            "under that account", "column": S.ACCOUNT_ID, "rows": no_account[:5]})
    ids = [tx for tx, _ in pairs if tx is not None]
    owned = iter(await run_in_threadpool(fraud.state().owned, ids, [who for tx, who in pairs if tx is not None]))
    return [tx is None or next(owned) for tx, _ in pairs]


def add_reset_route(router: APIRouter, fraud: FraudPredictor, route: ModelRoute[Any, Any, Any]) -> None:
    """``POST /v1/fraud/state/reset``."""

    @router.post("/v1/fraud/state/reset", response_model=FraudStateResetResponse)
    async def reset_state(body: FraudStateReset, request: Request,
                          principal: Annotated[Principal, Depends(require_scope(ADMIN))]) -> FraudStateResetResponse:
        """Forget one account's (or terminal's) online state: its next transaction scores as its first.

        For an account locked by a mis-dated transaction (its later real ones got 409), or state
        to correct after a data incident. Needs the scope ``admin``; audited (the id hashed).
        Every replica reads the state again before its next update.
        """
        from solutions.fraud.online import ACCOUNT, TERMINAL

        if (body.account_id is None) == (body.terminal_id is None):
            raise HTTPException(status_code=422, detail={"error": "give exactly one of account_id and terminal_id"})
        kind, key = (ACCOUNT, body.account_id) if body.account_id is not None else (TERMINAL, body.terminal_id)
        found = await run_in_threadpool(fraud.state().reset, kind, key)
        record_audit(request, model=fraud.model_name, model_version=route.slot.version or 0, rows=0,
                     decisions={f"{kind}_reset": int(found)}, subjects=[key])
        return FraudStateResetResponse(kind=kind, found=found)
