"""One generic route for every served model kind: batching, breaker, reload, challenger, logs.

A :class:`ModelRoute` serves one :class:`~infra.serving.predictor.Predictor` at its path. It owns:

* the champion's :class:`~infra.serving.slot.ModelSlot` (``predictor.setup`` loads each version; hot
  reload) and, unless its mode is ``off``, the challenger's
  (:class:`~infra.serving.challenger.ChallengerRoute`);
* a :class:`~infra.serving.batching.DynamicBatcher`: concurrent requests share one model call, one
  version for the whole batch;
* the circuit breaker around each model call: a call that fails for several requests is made again
  for each alone, so a request that breaks the model fails itself only;
* the challenger: scored beside the champion in the same batch (shadow), answering a stable share of
  subjects (split), never failing a request (its own breaker; the champion answers);
* the score log (both roles, the rows each decided) and the batch metrics;
* the answer: refused requests mapped to 4xx, the response and its audit line from the predictor.

A predictor that is not ``batchable`` has no batcher: each request is its own model call on the
server's thread pool, still behind the breaker. One that is not ``registered`` has a
:class:`LocalModel` in place of the slot: no reload, no challenger, no score log.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any, Generic

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel

from infra.errors import DataValidationError
from infra.registry import ModelRef
from infra.serving.audit import annotate_audit, record_audit
from infra.serving.batching import DynamicBatcher
from infra.serving.breaker import CircuitBreaker
from infra.serving.challenger import CHALLENGER_ROLE, CHAMPION_ROLE, ScoreRecord
from infra.serving.predictor import Answer, Audit, D, M, O, Predictor, Rows
from infra.serving.runtime import Services
from infra.serving.slot import ModelSlot

log = logging.getLogger(__name__)


class LocalModel(Generic[M]):
    """The model of a predictor that is no registry version (``registered = False``): built by
    ``setup(None)`` on the first request that needs it, kept for the server's life, with its own breaker."""

    def __init__(self, name: str, setup: Callable[[ModelRef | None], M], breaker: CircuitBreaker) -> None:
        self.name = name
        self.breaker = breaker
        self._setup = setup
        self._model: M | None = None
        self._lock = threading.Lock()

    def current(self) -> tuple[ModelRef | None, M]:
        """``(None, model)``: no version to name."""
        with self._lock:
            if self._model is None:
                self._model = self._setup(None)
            return None, self._model


class ModelRoute(Generic[D, M, O]):
    """The route of one predictor (see the module docstring); :meth:`mount` adds it to a router."""

    def __init__(self, services: Services, predictor: Predictor[D, M, O], *, challenger_mode: str = "off") -> None:
        self.services = services
        self.predictor = predictor
        self.name = predictor.model_name
        self.slot: ModelSlot[M] | LocalModel[M]
        if predictor.registered:
            self.slot = services.slot(self.name, predictor.setup)
            self.challenger = services.challenger(self.name, challenger_mode, predictor.setup)
        else:
            if challenger_mode != "off":
                raise ValueError(f"{self.name} is not a registered model: it has no challenger; got mode "
                                 f"{challenger_mode!r}")
            self.slot, self.challenger = LocalModel(self.name, predictor.setup, services.breaker(self.name)), None
        max_rows = predictor.batch_max_rows()
        self.batcher: DynamicBatcher[D, Answer[O]] | None = DynamicBatcher(
            self.run_batch, services.settings.batch_max_size, services.tuning.batch_max_wait_ms,
            name=f"{predictor.tag}-batcher", weight=predictor.size if max_rows is not None else None,
            max_batch_rows=max_rows) if predictor.batchable else None
        self._unpaired: set[tuple[int, int]] = set()  # (champion, challenger) versions warned of once

    # -- HTTP
    def mount(self, router: APIRouter) -> None:
        """Add the route (``POST predictor.path``) to ``router``."""
        predictor = self.predictor

        async def handler(request: Request, decoded: Any) -> Any:
            return await self.answer(request, decoded)

        # the predictor's own dependency decodes the body (this module's annotations are strings,
        # which FastAPI would evaluate in the module's namespace: the real objects are given)
        handler.__annotations__ = {"request": Request, "decoded": Annotated[Any, Depends(predictor.decode_request)],
                                   "return": Any}

        router.add_api_route(predictor.path, handler, methods=["POST"], name=predictor.route_name,
                             response_model=predictor.response_model, openapi_extra=predictor.openapi_extra,
                             description=predictor.description or inspect.cleandoc(type(predictor).__doc__ or ""))

    async def answer(self, request: Request, decoded: D) -> Response | BaseModel:
        """Score one decoded request in the next batch (alone, on the thread pool, when the predictor is
        not batchable); its response (or the HTTP error refusing it)."""
        if self.batcher is not None:
            [answer] = await self.batcher.submit([decoded])
        else:
            [answer] = await run_in_threadpool(self.run_batch, [decoded])
        if isinstance(answer.output, Exception):
            self.refuse(request, decoded, answer.ref, answer.output)
        encoded = self.predictor.encode_response(decoded, answer)
        audit(request, answer.ref, encoded.audit)
        return encoded.body

    def refuse(self, request: Request, decoded: D, ref: ModelRef | None, error: Exception) -> None:
        """Raise the HTTP error for a request its batch refused (a model failure is raised as it is:
        the app's 5xx/503 handlers answer it)."""
        refused = self.predictor.refuse(decoded, ref, error)
        if refused is not None:
            if refused.audit is not None:
                audit(request, ref, refused.audit)
            raise refused.error
        if isinstance(error, DataValidationError):
            raise HTTPException(status_code=422, detail={"error": str(error), "column": error.column,
                                                         "rows": error.rows})
        if isinstance(error, ValueError):  # the request's content (e.g. its column mapping)
            raise HTTPException(status_code=422, detail={"error": str(error)})
        raise error

    def close(self) -> None:
        """Stop the batcher (the slots are stopped by the app)."""
        if self.batcher is not None:
            self.batcher.close()

    # -- one batch, in the batcher's thread
    def run_batch(self, items: list[D]) -> list[Answer[O]]:
        """Score a batch with one champion version (and the challenger, if one pairs with it)."""
        ref, model = self.slot.current()
        paired = self.pick_challenger(ref, model)
        outputs = self.predict(model, items, paired[1] if paired is not None else None)
        rows: list[Rows | None] = [None if isinstance(o, Exception) else self.predictor.rows(o) for o in outputs]
        scored = [r for r in rows if r is not None]
        if scored:
            self.services.metrics.observe_batch(self.name, sum(len(r.ids) for r in scored))
        shadows = (self.shadow(paired[1], items, outputs) if paired is not None and scored else None) or [None] * len(items)
        answers = [self.decide(ref, out, r, paired[0] if paired is not None else None, shadow)
                   for out, r, shadow in zip(outputs, rows, shadows, strict=True)]
        self.record(ref, answers, rows, shadows)
        return answers

    def predict(self, model: M, items: list[D], challenger: M | None) -> list[O | Exception]:
        """The predictor's outputs, consecutive requests of one group per call, each call guarded by the
        breaker; a call that fails for several requests is made again for each alone."""
        out: list[O | Exception] = []
        start = 0
        while start < len(items):
            end = start + 1
            key = self.predictor.group(items[start])
            while end < len(items) and self.predictor.group(items[end]) == key:
                end += 1
            group = items[start:end]
            try:
                out += self.guarded(model, group, challenger)
            except Exception:  # nothing of the call took effect: each request again, alone
                if len(group) == 1:
                    raise
                for item in group:
                    try:
                        out += self.guarded(model, [item], challenger)
                    except Exception as exc:  # noqa: BLE001 - handed to that request only
                        out.append(exc)
            start = end
        return out

    def guarded(self, model: M, items: list[D], challenger: M | None) -> list[O | Exception]:
        """One model call counted by the breaker (a request's own errors do not count)."""
        with self.slot.breaker.guard(ignore=self.predictor.user_errors()):
            return self.predictor.predict(model, items, challenger)

    # -- the challenger
    def pick_challenger(self, ref: ModelRef | None, model: M) -> tuple[ModelRef, M] | None:
        """The challenger to score beside ``model`` now, if one is loaded and pairs with it."""
        current = self.challenger.current() if self.challenger is not None else None
        if current is None or ref is None or current[0].version == ref.version:
            return None
        why = self.predictor.pairs(model, current[1])
        if why is not None:
            pair = (ref.version, current[0].version)
            if pair not in self._unpaired:
                self._unpaired.add(pair)
                log.warning("challenger of %s: %s", self.name, why)
            return None
        return current

    def shadow(self, model: M, items: list[D], outputs: list[O | Exception]) -> list[tuple[O, Rows] | None] | None:
        """The challenger's output and rows of each request (None where it did not score; all None when
        its call failed: the champion answers)."""
        assert self.challenger is not None
        found = self.challenger.call(lambda: self.predictor.predict_challenger(model, items, outputs))
        if found is None:
            return None
        out: list[tuple[O, Rows] | None] = []
        for o in found:
            r = self.predictor.rows(o) if o is not None else None
            out.append((o, r) if o is not None and r is not None and len(r.ids) else None)
        return out

    def decide(self, ref: ModelRef | None, output: O | Exception, rows: Rows | None, challenger: ModelRef | None,
               shadow: tuple[O, Rows] | None) -> Answer[O]:
        """One request's answer: in split mode the challenger decides its share of subjects."""
        if rows is None or shadow is None or self.challenger is None:
            n = len(rows.ids) if rows is not None else 0
            return Answer(ref, output, by_challenger=np.zeros(n, dtype=bool))
        ch_output, ch_rows = shadow
        by = self.challenger.answers(rows.subjects)
        if by.any():  # only subjects the challenger scored
            by &= np.isin(np.asarray(rows.subjects, dtype=object), np.asarray(ch_rows.subjects, dtype=object))
        return Answer(ref, output, challenger, ch_output, by)

    # -- the score log
    def record(self, ref: ModelRef | None, answers: list[Answer[O]], rows: list[Rows | None],
               shadows: list[tuple[O, Rows] | None]) -> None:
        """One score-log line per role: every row's score, version and whether it decided the answer
        (a challenger's row decided when the split gave its subject to the challenger)."""
        done = [(a, r, s) for a, r, s in zip(answers, rows, shadows, strict=True)
                if r is not None and r.logged and len(r.ids)]
        if not done or ref is None:
            return
        self.services.scores.record(_record(self.name, ref.version, CHAMPION_ROLE, [r for _, r, _ in done],
                                            [~a.by_challenger for a, _, _ in done]))
        shadowed = [(a, r, s[1]) for a, r, s in done if s is not None and a.challenger is not None]
        if not shadowed:
            return
        decided = []
        for a, r, ch in shadowed:
            answered = np.asarray(r.subjects, dtype=object)[a.by_challenger]
            decided.append(np.isin(np.asarray(ch.subjects, dtype=object), answered) if len(answered)
                           else np.zeros(len(ch.ids), dtype=bool))
        version = shadowed[0][0].challenger.version  # type: ignore[union-attr]
        self.services.scores.record(_record(self.name, version, CHALLENGER_ROLE, [ch for _, _, ch in shadowed],
                                            decided))


def audit(request: Request, ref: ModelRef | None, a: Audit) -> None:
    """The request's audit line: the version, rows, decisions and subjects, then ``a.fields``; a model
    that is no registry version (``ref`` None) adds its fields only."""
    if ref is not None:
        record_audit(request, model=ref.name, model_version=ref.version, rows=a.rows, decisions=a.decisions,
                     subjects=a.subjects)
    if a.fields:
        annotate_audit(request, **a.fields)


def _record(model: str, version: int, role: str, rows: list[Rows], decided: list[np.ndarray]) -> ScoreRecord:
    extra = None
    if rows[0].extra:
        extra = {k: [v for r in rows for v in (r.extra or {})[k]] for k in rows[0].extra}
    return ScoreRecord(model=model, version=version, role=role, ids=[i for r in rows for i in r.ids],
                       scores=np.concatenate([r.scores for r in rows]).tolist(),
                       decided=np.concatenate(decided).tolist(), extra=extra)
