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
                      registry: ModelRegistry | None = None) -> Services:
        """Build every shared object; reads secrets from ``settings`` and the salt from the home."""
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
                               audience=settings.jwt_audience, max_lifetime_s=settings.jwt_max_lifetime_s),
            limiter=RateLimiter(settings.default_rate_limit, redis_url),
            audit=AuditLog((settings.audit_dir.expanduser() if settings.audit_dir else layout.serving()) / AUDIT_FILE,
                           salt, settings.audit_max_bytes, settings.audit_backups),
            scores=ScoreLog(layout.serving() / SCORES_DIR, enabled=settings.score_log),
        )

    def breaker(self, model: str) -> CircuitBreaker:
        """A circuit breaker for ``model`` with the configured thresholds, wired to the metrics."""
        s = self.settings
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
                                       poll_s=self.settings.reload_poll_s, metrics=self.metrics,
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
