"""A served model in four small methods, LitServe's ``LitAPI`` shape, with our own router.

A :class:`Predictor` says what is particular to one model kind:

* ``setup(ref)`` loads a registered version (run by the model's slot, in the background, again
  on every hot reload);
* ``decode_request`` is a FastAPI dependency: it parses and checks one request (its scope, its
  size) and returns what the batch is made of;
* ``predict(model, items)`` scores a batch of decoded requests with one version, per request its
  output or the error that refused that request alone;
* ``encode_response(decoded, answer)`` turns one request's :class:`Answer` into the response
  and what its audit line says.

:class:`~infra.serving.model_route.ModelRoute` owns the rest for every kind: dynamic batching,
the circuit breaker, hot reload, the challenger (shadow or split), the score log, the audit
line and the mapping of refused requests to 4xx. A predictor adds :meth:`Predictor.rows` (what the
split and the score log read of an output) and :meth:`Predictor.predict_challenger` (the challenger
scores what the champion's outputs hold: a stateful model's features are computed once).

Two class attributes widen the shape: ``batchable = False`` answers each request in its own
:meth:`Predictor.predict` call on the server's thread pool (a model that waits seconds on an upstream,
an LLM, would hold the batch's one thread); ``registered = False`` serves a model that is no registry
version (the knowledge base: an embedder, a vector store, an LLM endpoint): ``setup(None)`` builds it
once, on first use, and there is no hot reload, challenger or score log; its audit line holds the
:attr:`Audit.fields` only.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import orjson
from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from infra.registry import ModelRef
from infra.serving.breaker import USER_ERRORS

D = TypeVar("D")  # a decoded request
M = TypeVar("M")  # a loaded model version
O = TypeVar("O")  # noqa: E741 - one request's output
B = TypeVar("B", bound=BaseModel)


@dataclass(frozen=True)
class Rows:
    """What the router reads of one request's output, per row: its subject (the split's key: an
    account, an asset), its id in the score log, its score, and extra score-log columns.
    ``logged=False`` keeps the output out of the score log and the challenger (a retry answered
    from stored scores)."""

    subjects: Sequence[Any]
    ids: list[str]
    scores: np.ndarray
    extra: dict[str, list[Any]] | None = None
    logged: bool = True


@dataclass(frozen=True)
class Answer(Generic[O]):
    """One request as its batch answered it: the champion's version and output (or the error that
    refused the request; no version for a model that is not registered); where a challenger scored it, its version and output, and per champion row
    whether the challenger answers that row (split mode; all False otherwise)."""

    ref: ModelRef | None
    output: O | Exception
    challenger: ModelRef | None = None
    challenger_output: O | None = None
    by_challenger: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


@dataclass(frozen=True)
class Audit:
    """What a request's audit line says of it (:func:`~infra.serving.audit.record_audit`; subjects are raw
    ids, hashed there)."""

    rows: int
    decisions: dict[str, int]
    subjects: Sequence[Any] = ()
    #: more fields of the line (counts, names of configured things; never request text)
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Encoded:
    """A response and its audit."""

    body: Response | BaseModel
    audit: Audit


@dataclass(frozen=True)
class Refused:
    """A refused request's HTTP error, and its audit when the refusal is worth one."""

    error: HTTPException
    audit: Audit | None = None


class Predictor(Generic[D, M, O]):
    """One served model kind (see the module docstring). Subclasses set the class attributes and
    implement the four methods; the hooks below them have defaults for a stateless model."""

    #: the route's path, its name (OpenAPI operation id and summary) and tag
    path: str
    route_name: str
    tag: str
    #: the documented response (the route may return a ready :class:`Response` of that shape)
    response_model: type[BaseModel]
    #: ``openapi_extra`` of the route (a request body the predictor reads itself)
    openapi_extra: dict[str, Any] | None = None
    #: the route's description (default: the class docstring)
    description: str | None = None
    #: False: each request is one :meth:`predict` call on the server's thread pool, never batched
    batchable: bool = True
    #: False: the model is no registry version; :meth:`setup` gets None and runs once, on first use
    registered: bool = True

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    # -- the four methods
    def setup(self, ref: ModelRef | None) -> M:
        """Load ``ref`` for serving (runs in the slot's thread, never on a request); with
        ``registered = False``, build the model (``ref`` is None; on the first request)."""
        raise NotImplementedError

    decode_request: Callable[..., Awaitable[D]]
    """A FastAPI dependency (a method): the request's body as the batch item, after the request's own
    checks (scope, size); an :class:`HTTPException` refuses it before it joins a batch."""

    def predict(self, model: M, items: list[D], challenger: M | None = None) -> list[O | Exception]:
        """Per decoded request, its output or the error refusing that request alone (a
        :class:`~infra.errors.DataValidationError`, a ``ValueError`` of its content...); raises when the
        model call fails. ``challenger`` is the version about to score the same requests, if any."""
        raise NotImplementedError

    def encode_response(self, decoded: D, answer: Answer[O]) -> Encoded:
        """The response to one scored request (``answer.output`` is not an exception) and its audit."""
        raise NotImplementedError

    # -- hooks with defaults
    def size(self, item: D) -> int:
        """Rows of one decoded request (batches are capped in rows when :meth:`batch_max_rows` is set)."""
        return 1

    def batch_max_rows(self) -> int | None:
        """Most rows per model call (None: batches are capped in requests only)."""
        return None

    def group(self, item: D) -> object:
        """Requests scored in one :meth:`predict` call share this (consecutive ones only, in order)."""
        return None

    def user_errors(self) -> tuple[type[BaseException], ...]:
        """Errors raised by :meth:`predict` that are a request's fault: not counted by the breaker."""
        return USER_ERRORS

    def rows(self, output: O) -> Rows:
        """What the split and the score log read of an output (a model with a challenger or a score log)."""
        raise NotImplementedError

    def pairs(self, model: M, challenger: M) -> str | None:
        """Why ``challenger`` cannot be scored beside ``model`` now (None: it can)."""
        return None

    def predict_challenger(self, challenger: M, items: list[D], outputs: list[O | Exception]) -> list[O | None]:
        """The challenger's output of each request the champion scored (None where it cannot score), from
        what the champion's outputs hold (a stateful model's inputs are computed once, by the champion)."""
        raise NotImplementedError

    def refuse(self, decoded: D, ref: ModelRef | None, error: Exception) -> Refused | None:
        """A refusal particular to this kind (e.g. a 409 that is audited); None: the router's own mapping."""
        return None


async def read_json_body(request: Request, model: type[B]) -> B:
    """The request body as ``model``, parsed with orjson.

    What FastAPI does for a body parameter (parse, validate, 422 with the same error list), at a
    third of the cost on a 256-row body; NaN/Infinity literals, which orjson refuses and Python's
    parser accepts, go through ``json.loads``.
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
        return model.model_validate(data)
    except ValidationError as exc:
        # without the offending input: a value nested ~1,000 deep (orjson parses up to 1,024 levels)
        # made the error handler's encoder recurse past the limit (a 500)
        errors = exc.errors(include_url=False, include_input=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


def json_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` documenting a body that the route reads with :func:`read_json_body`."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}
