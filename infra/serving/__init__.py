"""Generic machinery of the online REST API (no domain code; the app is ``flows/serve``).

A served model is a :class:`~infra.serving.predictor.Predictor` of four methods (``setup``,
``decode_request``, ``predict`` batched, ``encode_response``: LitServe's ``LitAPI`` shape), and
:class:`~infra.serving.model_route.ModelRoute` serves any of them: it asks for the slots below, batches,
guards each model call with the breaker, runs the challenger, writes the score log and the audit
line (``flows/serve/fraud.py``, ``flows/serve/sensor.py``). What follows is the contract for a route
written by hand (the knowledge base, the registry).

The contract with a vertical's routes: a vertical module exposes
``build(services: Services) -> Vertical`` (:mod:`infra.serving.runtime`).
It asks ``services.slot(model_name, loader)`` for a :class:`~infra.serving.slot.ModelSlot` (the
registry champion, loaded by ``loader(ref) -> object`` in the background and hot-reloaded when the
alias moves; ``slot.current()`` returns ``(ModelRef, object)`` — take it once per request or batch
and label the response with that ``ref.version``). Its routes declare
``principal: Annotated[Principal, Depends(require_scope("fraud:score"))]`` (:mod:`infra.serving.auth`: 401
without or with a bad API key / JWT, 403 without the scope — ``admin`` grants every scope — and
429 + ``Retry-After`` over the key's rate limit), call ``check_rows(request, n)``
(:mod:`infra.serving.quotas`, 413 above ``max_rows``; the body size is limited before the route
runs), wrap every model call in ``with slot.breaker.guard(): ...`` (failures open the circuit
breaker: 503 with a reason and ``Retry-After`` during its cool-down; ``DataValidationError`` and
``HTTPException`` are user errors and do not count), report each scored batch with
``services.metrics.observe_batch(model_name, size)``, and end with
``record_audit(request, model=..., model_version=..., rows=n, decisions={"flagged": k},
subjects=[raw account ids])`` (:mod:`infra.serving.audit`; ids are hashed with the secret salt
before anything is written, the key itself never is). The ASGI middleware
(:mod:`infra.serving.middleware`) applies the IP allow-list, the body-size limit and the
per-request timeout, and writes the audit line and the request metrics of every request.
A route whose scope depends on the request (the knowledge base's ``kb:<collection>:read``)
declares ``Depends(require_any_scope("kb:"))`` and checks ``principal.allows(scope)`` itself; a
vertical whose routes need a larger body or a longer time limit sets
``services.route_limits[path_prefix] = RouteLimits(...)`` in ``build`` (a slow route also caps its
requests in flight, in all and per key, so it cannot take the worker threads every other route
needs; the middleware authenticates every ``/v1/...`` request before its body is read), and one without a model
version adds its audit fields with ``annotate_audit(request, collection=..., ...)``.
``Vertical(name, router, slots, on_start, on_stop)`` is mounted by ``flows.serve.app.create_app``;
``/readyz`` answers 200 only when every slot of every vertical has a model loaded.
"""
