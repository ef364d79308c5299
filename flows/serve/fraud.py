"""``POST /v1/fraud/score``: the fraud champion scores transactions as they arrive.

The champion may be of any registered kind: the sequence model, the GBM baseline or their
ensemble (:class:`~solutions.fraud.online.OnlineFraudModel` holds either part or both); the
alias can move from one kind to another while serving.

Each request carries one or more transactions in the project's transaction schema (the
batch path's column names, or source names with the same ``columns`` mapping as
``fraud score --columns``). Their features come from the online feature state
(:mod:`solutions.fraud.online`: embedded SQLite under the home, or Redis when
``INDUSFLOW_SERVE_REDIS_URL`` is set), so a transaction scores exactly as the batch ``score``
path scores it in a file holding everything seen before it. Concurrent requests are scored
together by a :class:`~infra.serving.batching.DynamicBatcher`, in arrival order.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import orjson
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.errors import DataValidationError
from infra.registry import KIND_SKLEARN, ModelRef
from infra.serving.audit import record_audit
from infra.serving.auth import ADMIN, Principal, require_scope
from infra.serving.batching import DynamicBatcher
from infra.serving.breaker import USER_ERRORS
from infra.serving.challenger import CHALLENGER_ROLE, CHAMPION_ROLE, SCORES_DIR, ScoreRecord
from infra.serving.quotas import check_rows
from infra.serving.runtime import ServeTuning, Services, Vertical
from infra.serving.tx_owners import TransactionOwners, open_owners
from solutions.fraud import schema as S

if TYPE_CHECKING:  # the model code (torch, Lightning) is imported when a model loads, not at startup
    from solutions.fraud.online import OnlineFraudModel, OnlineFraudState

log = logging.getLogger(__name__)

SCOPE = "fraud:score"
LABEL_SCOPE = "fraud:label"
#: Earlier transactions kept per account for sequences (a served model's seq_len - 1 at most).
HISTORY_LEN = 63

_EXAMPLE = {
    "transactions": [
        {"transaction_id": "tx-1001", "account_id": "A17", "timestamp": "2025-02-27T14:03:11",
         "amount": 42.5, "terminal_id": "T9", "channel": "pos", "category": "grocery",
         "age": 41, "occupation": "teacher", "account_age_days": 830}
    ]
}


class FraudScoreRequest(BaseModel):
    """Transactions to score, in arrival order (one account's rows in time order)."""

    model_config = ConfigDict(json_schema_extra={"examples": [_EXAMPLE]})

    transactions: list[dict[str, Any]] = Field(
        min_length=1,
        description="One object per transaction: transaction_id, account_id, timestamp, amount (required), "
        "terminal_id, channel, category, age, occupation, account_age_days (optional), label (optional, and only "
        "with the scope fraud:label: a known label feeds the delayed terminal risk of later transactions). Ids: "
        "strings, or integers (read as their decimal text: 5 and \"5\" are one account); floats and booleans are "
        "refused. Ids and categories at most 128 characters; amount 0 to INDUSFLOW_SERVE_FRAUD_MAX_AMOUNT; "
        f"timestamps at most {ServeTuning.max_clock_skew_s:g} s ahead of the server clock (naive ones read as UTC). "
        "A row up to that skew older than its account's latest is accepted (scored right after it); an older one "
        "gets 409.",
    )
    columns: dict[str, str] | None = Field(
        default=None, description="Column mapping canonical -> source name, as `fraud score --columns`.",
        examples=[{"account_id": "CUSTOMER_ID", "timestamp": "TX_DATETIME", "amount": "TX_AMOUNT"}],
    )


class FraudScore(BaseModel):
    """One transaction's score."""

    transaction_id: str
    score: float = Field(description="Fraud probability.")
    flagged: bool = Field(description="score >= threshold.")
    threshold: float = Field(description="The threshold of the version that decided this row.")
    model: str
    model_version: int = Field(description="The version that decided this row: the champion, or in split mode "
                               "the challenger for its share of accounts.")


class FraudScoreResponse(BaseModel):
    """Scores in request order; each row names the version that decided it."""

    model: str
    model_version: int = Field(description="The champion's version.")
    threshold: float = Field(description="The champion's threshold.")
    results: list[FraudScore]
    replayed: bool = Field(
        default=False,
        description="True when every transaction of the request had already been scored (a retry after a lost "
        "answer, on this replica or another): the scores are those given the first time (the champion's, each "
        "row naming the version that computed it) and nothing was applied again.")


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


async def read_score_request(request: Request) -> FraudScoreRequest:
    """The request body as a :class:`FraudScoreRequest`, parsed with orjson.

    What FastAPI does for a body parameter (parse, validate, 422 with the same error list),
    at a third of the cost on a 256-row body; NaN/Infinity literals, which orjson refuses
    and Python's parser accepts, go through ``json.loads`` as before.
    """
    raw = await request.body()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body", getattr(exc, "pos", 0)),
                                           "msg": "JSON decode error", "input": {},
                                           "ctx": {"error": getattr(exc, "msg", str(exc))}}]) from None
        except RecursionError:  # orjson stops at depth 1024; Python's parser runs out of stack
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body", 0),
                                           "msg": "JSON decode error", "input": {},
                                           "ctx": {"error": "nested more than 1024 levels deep"}}]) from None
    try:
        return FraudScoreRequest.model_validate(data)
    except ValidationError as exc:
        # without the offending input: a value nested ~1,000 deep (orjson parses up to 1,024 levels)
        # made the error handler's encoder recurse past the limit (a 500)
        errors = exc.errors(include_url=False, include_input=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


#: The OpenAPI request body of ``/v1/fraud/score`` (the route reads its body itself).
SCORE_REQUEST_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": FraudScoreRequest.model_json_schema()}}}}


def load_online_model(ref: ModelRef, services: Services) -> OnlineFraudModel:
    """A registered fraud version of any kind (sequence model, GBM or their ensemble; a
    compressed variant of a sequence model) ready for online scoring."""
    from solutions.fraud import pipeline as P
    from solutions.fraud.candidates import load_baseline
    from solutions.fraud.model import build_module
    from solutions.fraud.online import OnlineFraudModel
    from tasks.compress import load_variant

    baseline = load_baseline(ref)  # the GBM of a GBM or ensemble version (skops, allow-listed)
    net, pre, seq_len = None, None, 1
    if ref.kind != KIND_SKLEARN:
        if "compression" in ref.params:
            net = load_variant(ref, services.registry, build_module)
            pre, cfg = P.preprocessing_from_params(ref.params)
        else:
            net, pre, cfg = P.model_from_params(ref.params, services.registry.load_state_dict(ref))
        seq_len = cfg.seq_len
        if seq_len - 1 > HISTORY_LEN:
            raise ValueError(f"{ref.spec} uses seq_len {seq_len}; online serving keeps {HISTORY_LEN} "
                             "earlier transactions per account")
    return OnlineFraudModel.from_registry(net, pre, seq_len, ref.name, ref.version, ref.params, baseline=baseline)


@dataclass(frozen=True)
class Served:
    """One request as the batch scored it: the champion's :class:`ScoredRequest`, the challenger's
    version and scores where it scored the request (None otherwise), and per row whether the
    challenger answers it (split mode; all False in shadow mode or without challenger scores)."""

    scored: Any  # solutions.fraud.online.ScoredRequest (imported with the model)
    challenger: ModelRef | None
    challenger_scores: np.ndarray | None
    by_challenger: np.ndarray


def _id_text(value: Any) -> str | None:
    """An id as the online state reads it (a string, or an integer as its decimal text); None otherwise,
    and for text no store can hold (a lone surrogate: the validation refuses that row)."""
    text = value if isinstance(value, str) else str(value) if type(value) is int else None
    if text is not None and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None
    return text


def _label_value(value: Any) -> int | None:
    """A label as validated by ``apply_labels`` (0/1, a number or its text), as an int."""
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


_Item = tuple[list[dict[str, Any]], dict[str, str] | None]
_Result = tuple[ModelRef, Any]  # the champion's version and a Served, or the error that refused the request


def build(services: Services) -> Vertical | None:
    """The fraud vertical of the API (None when no fraud model is configured)."""
    name = services.settings.fraud_model
    if not name:
        return None
    slot = services.slot(name, lambda ref: load_online_model(ref, services))
    challenger = services.challenger(name, services.settings.fraud_challenger_mode,
                                     lambda ref: load_online_model(ref, services))
    redis_url = services.settings.redis_url.get_secret_value() if services.settings.redis_url else None
    holder: dict[str, OnlineFraudState] = {}

    def state() -> OnlineFraudState:
        from infra.online_state import open_state_store
        from solutions.fraud.online import OnlineFraudState

        if "state" not in holder:
            # late rows within the clock skew are accepted (OnlineFraudState's late_tolerance_s): a row
            # dated up to the skew ahead cannot lock its account's real-time rows out
            holder["state"] = OnlineFraudState.for_model(
                open_state_store(services.layout.online_state(), redis_url), history_len=HISTORY_LEN,
                late_tolerance_s=services.tuning.max_clock_skew_s)
        return holder["state"]

    owners_holder: dict[str, TransactionOwners] = {}

    def owners() -> TransactionOwners:
        """Which account each transaction id was scored under (:mod:`infra.serving.tx_owners`)."""
        if "owners" not in owners_holder:
            owners_holder["owners"] = open_owners(services.layout.serving() / SCORES_DIR, name, redis_url)
        return owners_holder["owners"]

    def id_pairs(rows: list[dict[str, Any]], columns: dict[str, str] | None) -> list[tuple[str | None, str | None]]:
        """(transaction id, hashed account id) of each row (None where a value is missing or no id)."""
        id_col = (columns or {}).get(S.TRANSACTION_ID, S.TRANSACTION_ID)
        acct_col = (columns or {}).get(S.ACCOUNT_ID, S.ACCOUNT_ID)
        out: list[tuple[str | None, str | None]] = []
        for row in rows:
            acct = _id_text(row.get(acct_col))
            out.append((_id_text(row.get(id_col)), services.audit.hash_id(acct) if acct is not None else None))
        return out

    def claim_ids(rows: list[dict[str, Any]], columns: dict[str, str] | None) -> tuple[Exception | None, list[str]]:
        """Claim a request's transaction ids for their accounts: (the error refusing the request when one
        of them was scored under another account, the ids newly claimed)."""
        from solutions.fraud.online import OrderError

        pairs = [(i, tx, who) for i, (tx, who) in enumerate(id_pairs(rows, columns)) if tx is not None and who]
        if not pairs:
            return None, []
        taken, new = owners().claim([tx for _, tx, _ in pairs], [who for _, _, who in pairs])
        if taken:
            row, tx, _ = pairs[taken[0]]
            return OrderError(f"row {row}: transaction {tx!r} was already scored under another account; a transaction "
                              "id names one transaction (send it under its own account, or give this one its own id)"), []
        return None, new

    max_skew_ns = int(services.tuning.max_clock_skew_s * 1e9)

    def latest_time_ns() -> int:
        """The latest timestamp accepted now: the clock plus the skew, read as UTC or as the server's
        local wall time, whichever is later (clients may send naive local timestamps)."""
        now = time.time_ns()
        return max(now, now + time.localtime().tm_gmtoff * 10**9) + max_skew_ns

    def score_group(model: OnlineFraudModel, requests: list[list[dict[str, Any]]],
                    columns: dict[str, str] | None, keep: int | None) -> list[Any]:
        from solutions.fraud.online import OrderError, score_requests_with_inputs

        # a request's data error (a bad row, a row out of order, a damaged account entry) is the
        # client's or that entry's: it is answered 4xx/409 and never counts against the model
        with slot.breaker.guard(ignore=(*USER_ERRORS, OrderError)):
            return score_requests_with_inputs(model, state(), requests, columns, max_time_ns=latest_time_ns(),
                                              keep=keep, max_amount=services.settings.fraud_max_amount)

    logged: set[tuple[int, int]] = set()  # (champion, challenger) versions that cannot be paired, warned once

    def pick_challenger(model: OnlineFraudModel) -> tuple[ModelRef, OnlineFraudModel] | None:
        """The challenger to score beside ``model`` now, if one is loaded and can use its inputs."""
        from solutions.fraud.online import challenger_fits

        current = challenger.current() if challenger is not None else None
        if current is None or current[0].version == model.version:
            return None
        why = challenger_fits(model, current[1])
        if why is not None:
            pair = (model.version, current[0].version)
            if pair not in logged:
                logged.add(pair)
                log.warning("challenger of %s: %s", name, why)
            return None
        return current

    def shadow_scores(ch_model: OnlineFraudModel, results: list[Any]) -> list[np.ndarray | None]:
        """The challenger's scores of each scored request (None where it cannot score: rows without
        the terminal it needs, or its call failed)."""
        from solutions.fraud.online import ScoredRequest

        usable = [isinstance(r, ScoredRequest) and r.versions is None and (r.has_terminal or not ch_model.needs_terminal)
                  for r in results]
        inputs = [row for r, ok in zip(results, usable, strict=True) if ok for row in r.inputs]
        assert challenger is not None
        scores = challenger.call(lambda: ch_model.predict(inputs)) if inputs else np.zeros(0)
        out: list[np.ndarray | None] = []
        start = 0
        for r, ok in zip(results, usable, strict=True):
            if not ok or scores is None:
                out.append(None)
                continue
            out.append(scores[start : start + len(r.inputs)])
            start += len(r.inputs)
        return out

    def score_batch(items: list[_Item]) -> list[_Result]:
        from solutions.fraud.online import ScoredRequest

        ref, model = slot.current()  # one version for the whole batch
        paired = pick_challenger(model)
        keep = paired[1].seq_len if paired is not None else None
        claims = [claim_ids(rows, columns) for rows, columns in items]
        live = [i for i, (refused, _) in enumerate(claims) if refused is None]
        scored: list[Any] = [refused for refused, _ in claims]
        for i, result in zip(live, score_items(model, [items[i] for i in live], keep), strict=True):
            scored[i] = result
            if isinstance(result, Exception) and claims[i][1]:  # refused: its ids may be sent again
                owners().release(claims[i][1])
        services.metrics.observe_batch(name, sum(len(rows) for rows, _ in items))
        shadows = shadow_scores(paired[1], scored) if paired is not None else [None] * len(scored)
        out: list[_Result] = []
        for result, shadow in zip(scored, shadows, strict=True):
            if not isinstance(result, ScoredRequest):
                out.append((ref, result))
                continue
            by_challenger = (challenger.answers(result.accounts) if shadow is not None and challenger is not None
                             else np.zeros(len(result.scores), dtype=bool))
            out.append((ref, Served(result, paired[0] if shadow is not None and paired else None, shadow,
                                    by_challenger)))
        record_scores(ref, out)
        return out

    def score_items(model: OnlineFraudModel, items: list[_Item], keep: int | None) -> list[Any]:
        """Each request's ScoredRequest or the error that refused it, requests with one column mapping
        scored together."""
        scored: list[Any] = []
        # requests with different column mappings are validated separately, in order
        start = 0
        while start < len(items):
            end = start + 1
            while end < len(items) and items[end][1] == items[start][1]:
                end += 1
            group = [rows for rows, _ in items[start:end]]
            try:
                results = score_group(model, group, items[start][1], keep)
            except Exception:  # nothing was committed: each request again, alone
                if len(group) == 1:
                    raise
                results = []
                for rows in group:  # a request that fails alone gets its own error, the others their scores
                    try:
                        results += score_group(model, [rows], items[start][1], keep)
                    except Exception as exc:  # noqa: BLE001 - handed to that request only
                        results.append(exc)
            scored += results
            start = end
        return scored

    def record_scores(ref: ModelRef, out: list[_Result]) -> None:
        served = [r for _, r in out if isinstance(r, Served) and r.scored.versions is None]  # not a retry again
        if not served:
            return
        ids = [str(i) for s in served for i in s.scored.ids]
        decided_ch = np.concatenate([s.by_challenger for s in served])
        services.scores.record(ScoreRecord(
            model=name, version=ref.version, role=CHAMPION_ROLE, ids=ids,
            scores=np.concatenate([s.scored.scores for s in served]).tolist(), decided=(~decided_ch).tolist()))
        shadowed = [s for s in served if s.challenger_scores is not None]
        if shadowed and shadowed[0].challenger is not None:
            services.scores.record(ScoreRecord(
                model=name, version=shadowed[0].challenger.version, role=CHALLENGER_ROLE,
                ids=[str(i) for s in shadowed for i in s.scored.ids],
                scores=np.concatenate([s.challenger_scores for s in shadowed]).tolist(),
                decided=np.concatenate([s.by_challenger for s in shadowed]).tolist()))

    batcher: DynamicBatcher[_Item, _Result] = DynamicBatcher(
        score_batch, services.settings.batch_max_size, services.tuning.batch_max_wait_ms, name="fraud-batcher",
        weight=lambda item: len(item[0]), max_batch_rows=services.tuning.batch_max_rows)
    router = APIRouter(tags=["fraud"])

    @router.post("/v1/fraud/score", response_model=FraudScoreResponse, openapi_extra=SCORE_REQUEST_BODY)
    async def score(request: Request, principal: Annotated[Principal, Depends(require_scope(SCOPE))]) -> Response:
        """Score transactions with the fraud champion and add them to the online state.

        A row may carry its ``label`` (it then feeds the delayed terminal risk of later
        transactions at its terminal) only when the key also holds ``fraud:label``: otherwise the
        request is refused with 403 naming ``label``. Refused rather than ignored: a label moves
        other clients' scores exactly as ``/v1/fraud/labels`` does, so it needs that route's scope,
        and a client whose label was silently dropped would believe it had been recorded.

        A request sent again after its answer was lost (every transaction already scored, with the
        same id, timestamp and amount; on this replica or another) gets the scores given the first
        time, with ``replayed``, and changes nothing; such a retry is not written to the score log again.
        """
        body = await read_score_request(request)
        check_rows(request, len(body.transactions))
        label_col = (body.columns or {}).get(S.LABEL, S.LABEL)
        if not principal.allows(LABEL_SCOPE) and any(
                row.get(label_col) is not None and row.get(label_col) == row.get(label_col)  # NaN: no label
                for row in body.transactions):
            raise HTTPException(status_code=403, detail={
                "error": f"rows carry a label; recording labels needs the scope {LABEL_SCOPE!r}",
                "column": S.LABEL})
        from solutions.fraud.online import OrderError  # loaded with the model by now

        [(ref, result)] = await batcher.submit([(body.transactions, body.columns)])
        acct_col = (body.columns or {}).get(S.ACCOUNT_ID, S.ACCOUNT_ID)
        if isinstance(result, OrderError):  # audited with the accounts it concerned, hashed
            record_audit(request, model=ref.name, model_version=ref.version, rows=len(body.transactions),
                         decisions={"refused": len(body.transactions)},
                         subjects=[row.get(acct_col) for row in body.transactions])
            raise HTTPException(status_code=409, detail=str(result))
        if isinstance(result, DataValidationError):
            raise HTTPException(status_code=422, detail={"error": str(result), "column": result.column,
                                                         "rows": result.rows})
        if isinstance(result, ValueError):
            raise HTTPException(status_code=422, detail={"error": str(result)})
        if isinstance(result, Exception):
            raise result  # the model or the store failed on this request alone: the app's 5xx handlers
        threshold = float(ref.params.get("threshold", 0.5))
        id_col = (body.columns or {}).get(S.TRANSACTION_ID, S.TRANSACTION_ID)
        # the FraudScoreResponse document as plain dicts, serialised by orjson (building and
        # re-validating 256 pydantic models cost more than scoring the rows' features)
        results = [
            {"transaction_id": str(row.get(id_col)), "score": float(s), "flagged": bool(s >= threshold),
             "threshold": threshold, "model": ref.name, "model_version": ref.version}
            for row, s in zip(body.transactions, result.scored.scores.tolist(), strict=True)
        ]
        replayed = result.scored.versions is not None
        if replayed:  # sent again: each row as the version that scored it the first time decided it
            for row, version in zip(results, result.scored.versions, strict=True):
                if version != ref.version:
                    cut = float(services.registry.get(name, version).params.get("threshold", 0.5))
                    row.update(threshold=cut, flagged=bool(row["score"] >= cut), model_version=version)
        if result.by_challenger.any():  # split: the challenger answers its share of accounts
            ch, ch_scores = result.challenger, result.challenger_scores.tolist()
            ch_threshold = float(ch.params.get("threshold", 0.5))
            for i in np.flatnonzero(result.by_challenger).tolist():
                results[i].update(score=ch_scores[i], flagged=bool(ch_scores[i] >= ch_threshold),
                                  threshold=ch_threshold, model_version=ch.version)
        flagged = sum(r["flagged"] for r in results)
        record_audit(request, model=ref.name, model_version=ref.version, rows=len(results),
                     decisions={"flagged": flagged, "passed": len(results) - flagged},
                     subjects=[row.get(acct_col) for row in body.transactions])
        answer = {"model": ref.name, "model_version": ref.version, "threshold": threshold, "results": results}
        if replayed:
            answer["replayed"] = True
        return Response(orjson.dumps(answer), media_type="application/json")

    @router.post("/v1/fraud/labels", response_model=FraudLabelResponse)
    async def labels(body: FraudLabelRequest, request: Request,
                     principal: Annotated[Principal, Depends(require_scope(LABEL_SCOPE))]) -> FraudLabelResponse:
        """Record known labels: later transactions' delayed terminal risk counts them, as in the batch path,
        and the evidence flow (``python -m flows.fraud evidence``) joins them to each version's served scores."""
        from solutions.fraud.online import apply_labels

        check_rows(request, len(body.labels))
        pairs = id_pairs(body.labels, body.columns)
        no_account = [i for i, (_, who) in enumerate(pairs) if who is None]
        if no_account:
            raise HTTPException(status_code=422, detail={
                "error": f"{S.ACCOUNT_ID} is required: a label counts only for the transaction scored with that id "
                "under that account", "column": S.ACCOUNT_ID, "rows": no_account[:5]})
        ids = [tx for tx, _ in pairs if tx is not None]
        owned = iter(await run_in_threadpool(owners().owned, ids, [who for tx, who in pairs if tx is not None]))
        # a row without a readable id goes on to the validation, which names it (422)
        mine = [tx is None or next(owned) for tx, _ in pairs]
        rows = [row for row, ok in zip(body.labels, mine, strict=True) if ok]
        try:
            missing = set(await run_in_threadpool(apply_labels, state(), rows, body.columns) if rows else [])
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
        services.scores.record_labels(name, [tx for tx, _ in known], [label for _, label in known],
                                      source=principal.key_id)
        ref = slot.current()[0] if slot.ready else None
        record_audit(request, model=name, model_version=ref.version if ref else 0, rows=len(body.labels),
                     decisions={"recorded": len(body.labels) - len(unknown), "unknown": len(unknown)})
        return FraudLabelResponse(recorded=len(body.labels) - len(unknown), unknown=unknown)

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
        found = await run_in_threadpool(state().reset, kind, key)
        ref = slot.current()[0] if slot.ready else None
        record_audit(request, model=name, model_version=ref.version if ref else 0, rows=0,
                     decisions={f"{kind}_reset": int(found)}, subjects=[key])
        return FraudStateResetResponse(kind=kind, found=found)

    def stop() -> None:
        batcher.close()
        if "state" in holder:
            holder.pop("state").store.close()
        if "owners" in owners_holder:
            owners_holder.pop("owners").close()

    return Vertical("fraud", router, [slot], on_stop=stop)
