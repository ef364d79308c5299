"""``POST /v1/fraud/score``: the fraud champion scores transactions as they arrive.

The champion may be of any registered kind: the sequence model, the GBM baseline or their
ensemble (:class:`~solutions.fraud.online.OnlineFraudModel` holds either part or both); the
alias can move from one kind to another while serving.

Each request carries one or more transactions in the project's transaction schema (the
batch path's column names, or source names with the same ``columns`` mapping as
``fraud score --columns``). Their features come from the online feature state
(:mod:`solutions.fraud.online`: embedded RocksDB under the home, or Redis when
``INDUSFLOW_SERVE_REDIS_URL`` is set), so a transaction scores exactly as the batch ``score``
path scores it in a file holding everything seen before it. :class:`FraudPredictor` is the model in
four methods; :class:`~infra.serving.model_route.ModelRoute` serves it (batching in arrival order,
breaker, reload, challenger, score log, audit).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import orjson
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from flows.serve.fraud_labels import LABEL_SCOPE, add_label_route, add_reset_route
from infra.registry import KIND_SKLEARN, ModelRef
from infra.serving.auth import Principal, require_scope
from infra.serving.breaker import USER_ERRORS
from infra.serving.model_route import ModelRoute
from infra.serving.predictor import (
    Answer,
    Audit,
    Encoded,
    Predictor,
    Refused,
    Rows,
    json_body_openapi,
    read_json_body,
)
from infra.serving.quotas import check_rows
from infra.serving.runtime import ServeTuning, Services, Vertical
from solutions.fraud import schema as S

if TYPE_CHECKING:  # the model code (torch, Lightning) is imported when a model loads, not at startup
    from solutions.fraud.online import OnlineFraudModel, OnlineFraudState, ScoredRequest

SCOPE = "fraud:score"
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


class FraudPredictor(Predictor["FraudScoreRequest", "OnlineFraudModel", "ScoredRequest"]):
    """Score transactions with the fraud champion and add them to the online state.

    A row may carry its ``label`` (it then feeds the delayed terminal risk of later
    transactions at its terminal) only when the key also holds ``fraud:label``: otherwise the
    request is refused with 403 naming ``label``. Refused rather than ignored: a label moves
    other clients' scores exactly as ``/v1/fraud/labels`` does, so it needs that route's scope,
    and a client whose label was silently dropped would believe it had been recorded.

    A request sent again after its answer was lost (every transaction already scored, with the
    same id, timestamp and amount; on this replica or another) gets the scores given the first
    time, with ``replayed``, and changes nothing; such a retry is not written to the score log again.

    A transaction id names one transaction: the score log and the evidence flow name transactions
    by id alone, so an id scored under one account and sent again under another gets 409, and a
    label counts only when it names the account its id was scored under. The online state keeps,
    per transaction id, a keyed hash of its account (the audit's :meth:`~infra.serving.audit.AuditLog.hash_id`:
    no account id is stored for it), claimed in the same commit as the transaction and kept as long
    as its terminal row (as long as a label for it can count). Replicas must hash with one salt (a
    shared home, or one ``INDUSFLOW_SERVE_AUDIT_SALT``), as the challenger split already needs.
    """

    path = "/v1/fraud/score"
    route_name = "score"
    tag = "fraud"
    response_model = FraudScoreResponse
    openapi_extra = json_body_openapi(FraudScoreRequest)

    def __init__(self, model_name: str, services: Services) -> None:
        super().__init__(model_name)
        self.services = services
        self.redis_url = services.settings.redis_url.get_secret_value() if services.settings.redis_url else None
        self.max_skew_ns = int(services.tuning.max_clock_skew_s * 1e9)
        self._state: OnlineFraudState | None = None

    # -- the four methods
    def setup(self, ref: ModelRef) -> OnlineFraudModel:
        return load_online_model(ref, self.services)

    async def decode_request(self, request: Request,
                             principal: Annotated[Principal, Depends(require_scope(SCOPE))]) -> FraudScoreRequest:
        """The body (422 when invalid, 413 over the row limit); 403 for labels without ``fraud:label``."""
        body = await read_json_body(request, FraudScoreRequest)
        check_rows(request, len(body.transactions))
        label_col = (body.columns or {}).get(S.LABEL, S.LABEL)
        if not principal.allows(LABEL_SCOPE) and any(
                row.get(label_col) is not None and row.get(label_col) == row.get(label_col)  # NaN: no label
                for row in body.transactions):
            raise HTTPException(status_code=403, detail={
                "error": f"rows carry a label; recording labels needs the scope {LABEL_SCOPE!r}",
                "column": S.LABEL})
        return body

    def predict(self, model: OnlineFraudModel, items: list[FraudScoreRequest],
                challenger: OnlineFraudModel | None = None) -> list[ScoredRequest | Exception]:
        """Score the requests (one column mapping) in order, each claiming its transaction ids for
        its accounts in the same commit."""
        from solutions.fraud.online import score_requests_with_inputs

        return score_requests_with_inputs(
            model, self.state(), [body.transactions for body in items], items[0].columns,
            max_time_ns=self.latest_time_ns(), keep=challenger.seq_len if challenger is not None else None,
            max_amount=self.services.settings.fraud_max_amount,
            owners=[[who for _, who in self.id_pairs(body.transactions, body.columns)] for body in items])

    def encode_response(self, decoded: FraudScoreRequest, answer: Answer[ScoredRequest]) -> Encoded:
        """Scores in request order, each row naming the version that decided it; serialised by orjson
        (building and re-validating 256 pydantic models cost more than scoring the rows' features)."""
        ref, scored = answer.ref, answer.output
        assert not isinstance(scored, Exception)
        threshold = float(ref.params.get("threshold", 0.5))
        id_col = (decoded.columns or {}).get(S.TRANSACTION_ID, S.TRANSACTION_ID)
        results = [
            {"transaction_id": str(row.get(id_col)), "score": float(s), "flagged": bool(s >= threshold),
             "threshold": threshold, "model": ref.name, "model_version": ref.version}
            for row, s in zip(decoded.transactions, scored.scores.tolist(), strict=True)
        ]
        if scored.versions is not None:  # sent again: each row as the version that scored it the first time decided it
            for row, version in zip(results, scored.versions, strict=True):
                if version != ref.version:
                    cut = float(self.services.registry.get(self.model_name, version).params.get("threshold", 0.5))
                    row.update(threshold=cut, flagged=bool(row["score"] >= cut), model_version=version)
        if answer.by_challenger.any():  # split: the challenger answers its share of accounts
            ch, ch_output = answer.challenger, answer.challenger_output
            assert ch is not None and ch_output is not None
            ch_scores, ch_threshold = ch_output.scores.tolist(), float(ch.params.get("threshold", 0.5))
            for i in np.flatnonzero(answer.by_challenger).tolist():
                results[i].update(score=ch_scores[i], flagged=bool(ch_scores[i] >= ch_threshold),
                                  threshold=ch_threshold, model_version=ch.version)
        flagged = sum(r["flagged"] for r in results)
        body = {"model": ref.name, "model_version": ref.version, "threshold": threshold, "results": results}
        if scored.versions is not None:
            body["replayed"] = True
        return Encoded(Response(orjson.dumps(body), media_type="application/json"),
                       Audit(len(results), {"flagged": flagged, "passed": len(results) - flagged},
                             self.accounts(decoded.transactions, decoded.columns)))

    # -- the router's hooks
    def size(self, item: FraudScoreRequest) -> int:
        return len(item.transactions)

    def batch_max_rows(self) -> int | None:
        return self.services.tuning.batch_max_rows

    def group(self, item: FraudScoreRequest) -> object:
        return item.columns  # requests with different column mappings are validated separately, in order

    def user_errors(self) -> tuple[type[BaseException], ...]:
        # a request's data error (a bad row, a row out of order, a damaged account entry) is the
        # client's or that entry's: it is answered 4xx/409 and never counts against the model
        from solutions.fraud.online import OrderError

        return (*USER_ERRORS, OrderError)

    def rows(self, output: ScoredRequest) -> Rows:
        return Rows(subjects=output.accounts, ids=[str(i) for i in output.ids], scores=output.scores,
                    logged=output.versions is None)  # a retry is not logged again

    def pairs(self, model: OnlineFraudModel, challenger: OnlineFraudModel) -> str | None:
        from solutions.fraud.online import challenger_fits

        return challenger_fits(model, challenger)

    def predict_challenger(self, challenger: OnlineFraudModel, items: list[FraudScoreRequest],
                           outputs: list[ScoredRequest | Exception]) -> list[ScoredRequest | None]:
        """The challenger's scores of the inputs the champion's call computed (None for a request it
        cannot score: a retry, or rows without the terminal it needs)."""
        from solutions.fraud.online import ScoredRequest

        usable = [r if isinstance(r, ScoredRequest) and r.versions is None
                  and (r.has_terminal or not challenger.needs_terminal) else None for r in outputs]
        inputs = [row for r in usable if r is not None for row in r.inputs]
        scores = challenger.predict(inputs) if inputs else np.zeros(0)
        out: list[ScoredRequest | None] = []
        start = 0
        for r in usable:
            out.append(replace(r, scores=scores[start : start + len(r.inputs)]) if r is not None else None)
            start += len(r.inputs) if r is not None else 0
        return out

    def refuse(self, decoded: FraudScoreRequest, ref: ModelRef, error: Exception) -> Refused | None:
        from solutions.fraud.online import OrderError  # loaded with the model by now

        if not isinstance(error, OrderError):
            return None
        n = len(decoded.transactions)  # audited with the accounts it concerned, hashed
        return Refused(HTTPException(status_code=409, detail=str(error)),
                       Audit(n, {"refused": n}, self.accounts(decoded.transactions, decoded.columns)))

    # -- the online state
    def state(self) -> OnlineFraudState:
        """The online feature state, opened on first use."""
        from infra.online_state import open_state_store
        from solutions.fraud.online import OnlineFraudState

        if self._state is None:
            # late rows within the clock skew are accepted (OnlineFraudState's late_tolerance_s): a row
            # dated up to the skew ahead cannot lock its account's real-time rows out
            self._state = OnlineFraudState.for_model(
                open_state_store(self.services.layout.online_state(), self.redis_url), history_len=HISTORY_LEN,
                late_tolerance_s=self.services.tuning.max_clock_skew_s)
        return self._state

    def close(self) -> None:
        """Close the state (the app stops)."""
        state, self._state = self._state, None
        if state is not None:
            state.store.close()

    @staticmethod
    def accounts(rows: list[dict[str, Any]], columns: dict[str, str] | None) -> list[Any]:
        """The raw account id of each row (the audit hashes them)."""
        acct_col = (columns or {}).get(S.ACCOUNT_ID, S.ACCOUNT_ID)
        return [row.get(acct_col) for row in rows]

    def id_pairs(self, rows: list[dict[str, Any]], columns: dict[str, str] | None,
                 ) -> list[tuple[str | None, str | None]]:
        """(transaction id, hashed account id) of each row (None where a value is missing or no id)."""
        id_col = (columns or {}).get(S.TRANSACTION_ID, S.TRANSACTION_ID)
        acct_col = (columns or {}).get(S.ACCOUNT_ID, S.ACCOUNT_ID)
        out: list[tuple[str | None, str | None]] = []
        for row in rows:
            acct = _id_text(row.get(acct_col))
            out.append((_id_text(row.get(id_col)), self.services.audit.hash_id(acct) if acct is not None else None))
        return out

    def latest_time_ns(self) -> int:
        """The latest timestamp accepted now: the clock plus the skew, read as UTC or as the server's
        local wall time, whichever is later (clients may send naive local timestamps)."""
        now = time.time_ns()
        return max(now, now + time.localtime().tm_gmtoff * 10**9) + self.max_skew_ns


def build(services: Services) -> Vertical | None:
    """The fraud vertical of the API (None when no fraud model is configured)."""
    name = services.settings.fraud_model
    if not name:
        return None
    fraud = FraudPredictor(name, services)
    route = ModelRoute(services, fraud, challenger_mode=services.settings.fraud_challenger_mode)
    router = APIRouter(tags=["fraud"])
    route.mount(router)
    add_label_route(router, fraud, route)
    add_reset_route(router, fraud, route)

    def stop() -> None:
        route.close()
        fraud.close()

    return Vertical("fraud", router, [route.slot], on_stop=stop)
