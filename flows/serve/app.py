"""``create_app``: the REST API around the verticals' routers.

Every vertical module listed in :data:`DEFAULT_VERTICALS` exposes ``build(services) -> Vertical
| None`` (None: not served, e.g. no model configured); ``create_app`` mounts its router, starts
its model slots when the server starts and stops them when it stops. Shared by every route:
the middleware of :mod:`infra.serving.middleware` and the dependencies of
:mod:`infra.serving.auth` (see :mod:`infra.serving` for the whole contract).
"""

from __future__ import annotations

import gc
import importlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from flows.serve.kb_page import mount_kb_page
from infra.home import HomeLayout, home_layout
from infra.registry import ModelRegistry
from infra.serving.auth import Principal, require_scope
from infra.serving.middleware import EXCEPTION_HANDLERS, ServingMiddleware
from infra.serving.runtime import ServeTuning, Services, Vertical
from infra.serving.slot import import_model_libraries
from infra.settings import ServeSettings, get_serve_settings

log = logging.getLogger(__name__)

#: Vertical modules of ``flows.serve`` mounted by default, in order.
DEFAULT_VERTICALS: tuple[str, ...] = ("fraud", "sensor", "sensor_forecast", "kb", "registry")
METRICS_SCOPE = "metrics:read"
#: The server process's cyclic-GC thresholds while it runs (gc.set_threshold). Python's 700,10,10
#: promoted each in-flight batch's rows to the oldest generation, and full collections over the
#: online state paused scoring for 100-600 ms, 10-20 times a bench run; garbage without cycles is
#: freed at once either way. A fixed value: no one had a reason to tune it per deployment.
GC_THRESHOLDS = (50_000, 20, 20)


def default_verticals(services: Services) -> list[Vertical]:
    """The verticals of :data:`DEFAULT_VERTICALS` that are present and configured."""
    out = []
    for name in DEFAULT_VERTICALS:
        module_name = f"{__package__}.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            log.warning("serving: no module %s, the %s routes are not served", module_name, name)
            continue
        vertical = module.build(services)
        if vertical is not None:
            out.append(vertical)
    return out


DOCS_ASSETS = "/docs-assets"


def mount_docs(app: FastAPI) -> None:
    """``/docs``: the interactive API page with Swagger UI's files served by this server
    (package ``swagger-ui-bundle``), so it works behind a firewall with no internet. Its
    *Authorize* button takes an API key (``X-API-Key``) or a bearer token: the schemes every
    protected route declares (:data:`infra.serving.auth.API_KEY_SCHEME`, ``BEARER_SCHEME``)."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - docs",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
                                   swagger_ui_parameters={"persistAuthorization": True})


def create_app(settings: ServeSettings | None = None, *,
               verticals: Sequence[Vertical] | None = None,
               build_verticals: Sequence[object] | None = None,
               layout: HomeLayout | None = None, registry: ModelRegistry | None = None,
               tuning: ServeTuning | None = None) -> FastAPI:
    """The FastAPI app of the REST API.

    Args:
        settings: serving settings (default: read from the environment now).
        verticals: ready-made verticals (tests); default: :func:`default_verticals`.
        build_verticals: callables ``build(services) -> Vertical | None`` to use instead of
            the default modules (tests and benches mount their own).
        layout: the home (default: ``INDUSFLOW_HOME``).
        registry: the model registry (default: the home's).
        tuning: the API's fixed limits and timings (default: :class:`ServeTuning`'s; tests pass faster ones).
    """
    settings = settings if settings is not None else get_serve_settings()
    layout = layout if layout is not None else home_layout()
    services = Services.from_settings(settings, layout, registry, tuning)
    mounted: list[Vertical] = list(verticals or [])
    if build_verticals is not None:
        mounted += [v for v in (b(services) for b in build_verticals) if v is not None]  # type: ignore[operator]
    elif verticals is None:
        mounted += default_verticals(services)
    slots = [slot for v in mounted for slot in v.slots]
    for slot in slots:
        if slot not in services.slots:
            services.slots.append(slot)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gc_before = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)
        if services.slots:
            import_model_libraries()
        for slot in services.slots:
            slot.start()
        for vertical in mounted:
            if vertical.on_start is not None:
                vertical.on_start()
        try:
            yield
        finally:
            for vertical in mounted:
                if vertical.on_stop is not None:
                    vertical.on_stop()
            for slot in services.slots:
                slot.stop()
            services.scores.close()
            gc.set_threshold(*gc_before)

    app = FastAPI(
        title="indusflow serving API",
        description="Online scoring of the registered champions. Send an API key in `X-API-Key` "
        "(or `Authorization: Bearer`); `python -m flows.serve keys add` creates one. On this page: "
        "*Authorize*, then *Try it out*.",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # served below from packaged assets: the default page loads them from a CDN
        redoc_url=None,
    )
    app.state.serving = services
    mount_docs(app)
    mount_kb_page(app)
    for exc_type, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_type, handler)

    @app.get("/healthz", tags=["probes"])
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["probes"])
    async def readyz() -> JSONResponse:
        """Readiness: 200 only when every served model has a version loaded and its circuit breaker
        closed (a model whose breaker is open answers 503 to every call: a load balancer should send
        its traffic elsewhere meanwhile). A challenger is listed under ``challengers``, its version or
        null, and is not waited for."""
        models = {slot.name: slot.version for slot in services.slots if not slot.optional}
        waiting = {slot.name: slot.last_error or "loading" for slot in services.slots
                   if not slot.ready and not slot.optional}
        waiting.update({slot.name: "circuit breaker open" for slot in services.slots
                        if not slot.optional and slot.name not in waiting and slot.breaker.is_open})
        body: dict[str, object] = {"ready": not waiting, "models": models, "waiting": waiting}
        challengers = {slot.label: slot.version for slot in services.slots if slot.optional}
        if challengers:
            body["challengers"] = challengers
        return JSONResponse(body, status_code=200 if not waiting else 503)

    @app.get("/metrics", tags=["probes"])
    async def metrics(principal: Annotated[Principal, Depends(require_scope(METRICS_SCOPE))]) -> Response:
        """Prometheus metrics (scope ``metrics:read`` or ``admin``)."""
        return Response(services.metrics.render(), media_type=services.metrics.content_type)

    for vertical in mounted:
        app.include_router(vertical.router)
    app.add_middleware(ServingMiddleware, services=services)
    return app
