"""What a running API holds (:class:`Services`), and what a vertical contributes (:class:`Vertical`).

``create_app`` builds one :class:`Services` from the settings and the home, hands it to every
vertical's ``build(services)``, and leaves it on ``app.state.serving`` where the dependencies
(:func:`~infra.serving.auth.require_scope`) and the middleware find it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import APIRouter

from infra.home import HomeLayout
from infra.registry import CHALLENGER, CHAMPION, ModelRef, ModelRegistry
from infra.serving.audit import AuditLog, load_or_create_salt
from infra.serving.auth import Authenticator, KeyStore
from infra.serving.breaker import CircuitBreaker
from infra.serving.challenger import SCORES_DIR, ChallengerRoute, ScoreLog
from infra.serving.metrics import ServingMetrics
from infra.serving.quotas import RateLimiter, RouteLimits
from infra.serving.slot import ModelSlot
from infra.settings import ServeSettings

T = TypeVar("T")

KEYS_FILE = "keys.json"
AUDIT_FILE = "audit.jsonl"
SALT_FILE = "audit.salt"


@dataclass(frozen=True)
class ServeTuning:
    """The API's fixed limits and timings (no settings: each value's reason is beside it); ``create_app``
    takes another for tests that need a faster reload, a smaller breaker or a lower limit."""

    #: longest a bearer token may live (exp minus iat, or minus now without iat; 401 above): a day, so a leaked
    #: token cannot stay valid for years, while identity providers' tokens (minutes to hours) all pass
    jwt_max_lifetime_s: float = 86_400.0
    #: rate limit of requests without a valid credential, per client address (429 above, instead of 401/403):
    #: a credential guesser or a flood of bad tokens is slowed like a key
    unauthenticated_rate_limit: str = "60/minute"
    #: most long-format sensor readings one request may carry (413 above): a window of fast sensors holds many
    #: readings per grid step, so this is about 50 per row of INDUSFLOW_SERVE_MAX_ROWS
    max_readings: int = 50_000
    #: audit log size at which it is rotated (audit.jsonl.1, ...), and rotated files kept: at most 300 MB a replica
    audit_max_bytes: int = 50_000_000
    audit_backups: int = 5
    #: the circuit breaker opens when this share of model calls failed over the window, once it saw min_calls,
    #: and answers 503 for the cool-down before it tries the model again
    breaker_error_share: float = 0.3
    breaker_window_s: float = 30.0
    breaker_min_calls: int = 10
    breaker_cooldown_s: float = 30.0
    #: how often the registry's champion alias is checked for a new version: a promotion is served within 5 s,
    #: each check is one small file read
    reload_poll_s: float = 5.0
    #: most transactions in one fraud model call (a larger single request still runs, alone): one full request
    #: of INDUSFLOW_SERVE_MAX_ROWS
    batch_max_rows: int = 1024
    #: longest a request waits for others to join its batch: 2 ms, well under a model call's own time, so a lone
    #: request barely waits (bench/serve_bench.py compares batching on and off)
    batch_max_wait_ms: float = 2.0
    #: most seconds a scored transaction's timestamp may lie ahead of the server clock (naive timestamps: UTC or
    #: the server's local time, whichever is later; later ones get 422: a future-dated row would make every later
    #: real one of its account 'older'); rows up to this late still join their account (no lock-out)
    max_clock_skew_s: float = 300.0


def key_store(layout: HomeLayout) -> KeyStore:
    """The API keys of a home (``<home>/serving/keys.json``)."""
    return KeyStore(layout.serving() / KEYS_FILE)


@dataclass
class Vertical:
    """One vertical's part of the API.

    Attributes:
        name: its name (``fraud``), used in logs and ``/readyz``.
        router: its routes (mounted as they are: paths such as ``/v1/fraud/score``).
        slots: the models it serves; ``/readyz`` waits for each to be loaded.
        on_start: called once the server starts (open a feature store...), after the slots start.
        on_stop: called when it stops (flush and close).
    """

    name: str
    router: APIRouter
    slots: Sequence[ModelSlot[Any]] = ()
    on_start: Callable[[], None] | None = None
    on_stop: Callable[[], None] | None = None


@dataclass
class Services:
    """The server's shared objects, built once per app from the settings and the home."""

    settings: ServeSettings
    layout: HomeLayout
    registry: ModelRegistry
    metrics: ServingMetrics
    auth: Authenticator
    limiter: RateLimiter
    audit: AuditLog
    scores: ScoreLog
    tuning: ServeTuning = field(default_factory=ServeTuning)
    slots: list[ModelSlot[Any]] = field(default_factory=list)
    #: Model name -> its challenger (:meth:`challenger`).
    challengers: dict[str, ChallengerRoute[Any]] = field(default_factory=dict)
    #: Path prefix -> :class:`RouteLimits`, set by verticals in ``build``; the longest prefix wins.
    route_limits: dict[str, RouteLimits] = field(default_factory=dict)

    def limits_for(self, path: str) -> tuple[int, float]:
        """``(max body bytes, timeout seconds)`` of a request path."""
        _, limits = self.route_limits_for(path)
        body = limits.max_body_bytes if limits.max_body_bytes is not None else self.settings.max_body_bytes
        timeout = limits.timeout_s if limits.timeout_s is not None else self.settings.request_timeout_s
        return body, timeout

    def route_limits_for(self, path: str) -> tuple[str, RouteLimits]:
        """The prefix whose :class:`RouteLimits` apply to ``path`` (the longest that matches; ``""``
        and no limits when none does) and those limits."""
        best, found = "", RouteLimits()
        for prefix, limits in self.route_limits.items():
            if path.startswith(prefix) and len(prefix) > len(best):
                best, found = prefix, limits
        return best, found

    @classmethod
    def from_settings(cls, settings: ServeSettings, layout: HomeLayout,
                      registry: ModelRegistry | None = None, tuning: ServeTuning | None = None) -> Services:
        """Build every shared object; reads secrets from ``settings`` and the salt from the home."""
        tuning = tuning or ServeTuning()
        secret = settings.jwt_hs256_secret.get_secret_value() if settings.jwt_hs256_secret else None
        public = settings.jwt_rs256_public_key.get_secret_value() if settings.jwt_rs256_public_key else None
        salt = (settings.audit_salt.get_secret_value().encode() if settings.audit_salt
                else load_or_create_salt(layout.serving() / SALT_FILE))
        redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
        return cls(
            settings=settings,
            layout=layout,
            registry=registry if registry is not None else ModelRegistry(layout.registry()),
            metrics=ServingMetrics(),
            auth=Authenticator(key_store(layout), hs256_secret=secret, rs256_public_key=public,
                               audience=settings.jwt_audience, max_lifetime_s=tuning.jwt_max_lifetime_s),
            limiter=RateLimiter(settings.default_rate_limit, redis_url),
            audit=AuditLog((settings.audit_dir.expanduser() if settings.audit_dir else layout.serving()) / AUDIT_FILE,
                           salt, tuning.audit_max_bytes, tuning.audit_backups),
            scores=ScoreLog(layout.serving() / SCORES_DIR),
            tuning=tuning,
        )

    def breaker(self, model: str) -> CircuitBreaker:
        """A circuit breaker for ``model`` with the configured thresholds, wired to the metrics."""
        s = self.tuning
        gauge = self.metrics.breaker_open.labels(model=model)
        gauge.set(0)
        return CircuitBreaker(model, error_share=s.breaker_error_share, window_s=s.breaker_window_s,
                              min_calls=s.breaker_min_calls, cooldown_s=s.breaker_cooldown_s,
                              on_change=lambda is_open: gauge.set(1 if is_open else 0))

    def slot(self, model: str, loader: Callable[[ModelRef], T], alias: str = CHAMPION) -> ModelSlot[T]:
        """A :class:`ModelSlot` following ``model``'s champion (or another alias: an optional slot that
        readiness does not wait for), with its own breaker; started by the app."""
        label = model if alias == CHAMPION else f"{model}@{alias}"
        slot: ModelSlot[T] = ModelSlot(model, loader, registry=self.registry, alias=alias,
                                       poll_s=self.tuning.reload_poll_s, metrics=self.metrics,
                                       breaker=self.breaker(label), optional=alias != CHAMPION)
        self.slots.append(slot)
        return slot

    def challenger(self, model: str, mode: str, loader: Callable[[ModelRef], T]) -> ChallengerRoute[T] | None:
        """The challenger of ``model`` (a slot following the registry's ``challenger`` alias), or None when its
        mode is ``off``."""
        if mode == "off":
            return None
        route: ChallengerRoute[T] = ChallengerRoute(self.slot(model, loader, alias=CHALLENGER), mode=mode,
                                                    share=self.settings.challenger_share, salt=self.audit.split_key())
        self.challengers[model] = route
        return route
