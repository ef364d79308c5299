"""Who is calling: API keys (stored hashed under the home), JWT bearer tokens, scopes.

An API key reads ``ifk_<key id>_<secret>``; the store keeps the key id, a random salt and
``sha256(salt + secret)`` only, so the key is shown once (by ``python -m flows.serve keys add``)
and never again. The secret holds 256 random bits, so a fast salted hash is as strong as a slow
one here (scrypt protects guessable passwords, and would cost ~50 ms per request). A key comes in
the ``X-API-Key`` header or as ``Authorization: Bearer <key>``; any other bearer token is a JWT,
verified with the HS256 secret or the RS256 public key of the settings (``exp`` required; scopes
from the ``scope`` claim, space-separated, or a ``scopes`` list).

Routes declare what they need with ``Depends(require_scope("fraud:score"))``; ``admin`` grants
every scope. A key may be bound to a person when it is made (``keys add --person alice``): the
registry's approval route then refuses a decision it carries unless that person signed it, and the
trail names the key and its person beside the signer.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request, Security
from fastapi.security import APIKeyHeader, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from infra.store import write_json_atomic

log = logging.getLogger(__name__)

KEY_PREFIX = "ifk_"
ADMIN = "admin"
_KEY_RE = re.compile(r"^ifk_([0-9a-f]{12})_([A-Za-z0-9_-]{20,})$")
_SCOPE_RE = re.compile(r"^[a-z][a-z0-9_-]*(:[a-z][a-z0-9_-]*)?$")
#: A scope on one resource of an area: ``kb:<collection>:read`` / ``:write`` / ``:source`` (original files).
_RESOURCE_SCOPE_RE = re.compile(r"^[a-z][a-z0-9_-]*:[a-z][a-z0-9_]{0,39}:(read|write|source)$")
#: Approval of one registry model's alias moves: ``registry:approve:<model>``.
_MODEL_SCOPE_RE = re.compile(r"^registry:approve:[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$")


class AuthError(Exception):
    """A bad credential (401) or a missing scope (403); the message names no secret."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    Attributes:
        key_id: the API key's id, or ``jwt:<hash of the subject>``; safe to log.
        scopes: what it may call.
        rate_limit: its own rate limit (``N/minute``), or None for the server default.
        person: the person the key was bound to when it was made (None: not bound, or a JWT).
        created_by: the OS account that made the key (None: a JWT, or a key made before it was recorded).
    """

    key_id: str
    scopes: frozenset[str]
    rate_limit: str | None = None
    person: str | None = None
    created_by: str | None = None

    def allows(self, scope: str) -> bool:
        """True when the principal holds ``scope`` or ``admin``."""
        return scope in self.scopes or ADMIN in self.scopes


class ApiKeyRecord(BaseModel):
    """One stored key: its id, hash and salt, never the key."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    name: str
    salt: str
    sha256: str
    scopes: list[str]
    rate_limit: str | None = None
    person: str | None = Field(default=None, description="The person the key is bound to (its holder).")
    created_by: str | None = Field(default=None, description="The OS account that made the key.")
    created_at: str
    revoked_at: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def check_scopes(scopes: Iterable[str]) -> list[str]:
    """Validated scope names (``fraud:score``, ``kb:legal:read``, ``admin``); ValueError names the bad one."""
    out = []
    for scope in scopes:
        if not (_SCOPE_RE.match(scope) or _RESOURCE_SCOPE_RE.match(scope) or _MODEL_SCOPE_RE.match(scope)):
            raise ValueError(f"scope {scope!r} is not of the form area:action (e.g. fraud:score), "
                             "area:resource:read|write|source (e.g. kb:legal:read), registry:approve:<model> "
                             "or admin")
        out.append(scope)
    if not out:
        raise ValueError("a key needs at least one scope (e.g. fraud:score, sensor:predict, admin)")
    return sorted(set(out))


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


class KeyStore:
    """API keys in one JSON file (``<home>/serving/keys.json``), hashed; re-read when it changes.

    Several processes may add or revoke keys at once (a lock file serialises the writers); a
    running server sees a change at its next request.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: tuple[float, int, dict[str, ApiKeyRecord]] | None = None
        self._guard = threading.Lock()

    # -- reading
    def _load(self) -> dict[str, ApiKeyRecord]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        cached = self._cache
        if cached is not None and cached[0] == stat.st_mtime and cached[1] == stat.st_size:
            return cached[2]
        with self._guard:
            records = {r["key_id"]: ApiKeyRecord(**r) for r in json.loads(self.path.read_text())["keys"]}
            self._cache = (stat.st_mtime, stat.st_size, records)
        return records

    def list(self) -> list[ApiKeyRecord]:
        """Every key (revoked ones too), oldest first."""
        return sorted(self._load().values(), key=lambda r: r.created_at)

    def verify(self, key: str) -> ApiKeyRecord | None:
        """The active record of ``key``, or None (unknown, malformed or revoked)."""
        match = _KEY_RE.match(key)
        if not match:
            return None
        record = self._load().get(match.group(1))
        if record is None or not record.active:
            return None
        return record if hmac.compare_digest(record.sha256, _digest(record.salt, match.group(2))) else None

    # -- writing
    @contextmanager
    def _locked(self) -> Iterator[dict[str, ApiKeyRecord]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                self._cache = None
                records = dict(self._load())
                yield records
                write_json_atomic(self.path, {"keys": [r.model_dump() for r in records.values()]})
                self._cache = None
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def add(self, name: str, scopes: Iterable[str], rate_limit: str | None = None,
            person: str | None = None) -> tuple[str, ApiKeyRecord]:
        """Create a key (bound to ``person`` when given); returns ``(key, record)`` — the key is not
        stored and cannot be shown again. The record names the OS account that made it."""
        if not _NAME_RE.match(name):
            raise ValueError(f"key name {name!r}: use 1-64 letters, digits, spaces, '.', '_' or '-'")
        if person is not None and not _NAME_RE.match(person):
            raise ValueError(f"person {person!r}: use 1-64 letters, digits, spaces, '.', '_' or '-'")
        scope_list = check_scopes(scopes)
        if rate_limit is not None:
            from infra.serving.quotas import parse_rate

            parse_rate(rate_limit)
        from infra.registry import current_actor

        secret = secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        with self._locked() as records:
            key_id = secrets.token_hex(6)
            while key_id in records:
                key_id = secrets.token_hex(6)
            record = ApiKeyRecord(
                key_id=key_id, name=name, salt=salt, sha256=_digest(salt, secret), scopes=scope_list,
                rate_limit=rate_limit, person=person, created_by=current_actor(),
                created_at=dt.datetime.now(dt.UTC).isoformat(),
            )
            records[key_id] = record
        return f"{KEY_PREFIX}{key_id}_{secret}", record

    def revoke(self, key_id: str) -> ApiKeyRecord:
        """Revoke a key by id (it stays listed, marked revoked); KeyError if unknown."""
        with self._locked() as records:
            if key_id not in records:
                known = ", ".join(sorted(records)) or "none"
                raise KeyError(f"no API key with id {key_id!r} (known ids: {known})")
            record = records[key_id]
            if record.active:
                record = record.model_copy(update={"revoked_at": dt.datetime.now(dt.UTC).isoformat()})
                records[key_id] = record
        return record


class Authenticator:
    """Turns request headers into a :class:`Principal` (API key or JWT).

    Args:
        keys: the key store.
        hs256_secret: secret of HS256 tokens, if accepted.
        rs256_public_key: PEM public key of RS256 tokens, if accepted.
        audience: the required ``aud`` claim, if any.
        max_lifetime_s: the longest a token may live (``exp`` minus ``iat``, or minus now).
    """

    def __init__(self, keys: KeyStore, *, hs256_secret: str | None = None,
                 rs256_public_key: str | None = None, audience: str | None = None,
                 max_lifetime_s: float = 86_400.0) -> None:
        self.max_lifetime_s = max_lifetime_s
        self.keys = keys
        self._jwt_keys: list[tuple[str, str]] = []
        if hs256_secret:
            self._jwt_keys.append(("HS256", hs256_secret))
        if rs256_public_key:
            self._jwt_keys.append(("RS256", rs256_public_key))
        self.audience = audience

    def authenticate(self, api_key: str | None, authorization: str | None) -> Principal:
        """The caller, or :class:`AuthError` (401)."""
        token = None
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise AuthError(401, "the Authorization header must be 'Bearer <token>'")
            token = value.strip()
        if api_key is None and token is not None and token.startswith(KEY_PREFIX):
            api_key, token = token, None
        if api_key is not None:
            record = self.keys.verify(api_key.strip())
            if record is None:
                raise AuthError(401, "invalid or revoked API key")
            return Principal(record.key_id, frozenset(record.scopes), record.rate_limit, record.person,
                             record.created_by)
        if token is not None:
            return self._from_jwt(token)
        raise AuthError(401, "no credential: send X-API-Key or Authorization: Bearer <token>")

    def _from_jwt(self, token: str) -> Principal:
        import jwt

        if not self._jwt_keys:
            raise AuthError(401, "bearer tokens are not accepted by this server (no JWT key configured)")
        claims = None
        for algorithm, key in self._jwt_keys:
            try:
                claims = jwt.decode(
                    token, key, algorithms=[algorithm], audience=self.audience,
                    options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
                )
                break
            except jwt.PyJWTError:
                continue
        if claims is None:
            raise AuthError(401, "invalid bearer token (signature, expiry, audience or claims)")
        return Principal(f"jwt:{_subject(claims)}", frozenset(self._scopes(claims)), None)

    def _scopes(self, claims: dict[str, Any]) -> list[str]:
        """The token's scopes, once its lifetime and claim types are checked (401 otherwise:
        a signed token with ``"scope": 5`` is a bad token, not a server error)."""
        born = claims.get("iat", time.time())
        if not isinstance(born, int | float) or isinstance(born, bool):
            raise AuthError(401, "invalid bearer token: 'iat' must be a number")
        if not isinstance(claims["exp"], int | float) or isinstance(claims["exp"], bool):  # PyJWT reads "123" too
            raise AuthError(401, "invalid bearer token: 'exp' must be a number (RFC 7519 NumericDate)")
        if claims["exp"] - born > self.max_lifetime_s:
            raise AuthError(401, f"bearer token lives longer than this server accepts "
                                 f"({self.max_lifetime_s:g} s from issue to expiry)")
        if "scopes" in claims:
            raw = claims["scopes"]
            if not (isinstance(raw, list) and all(isinstance(s, str) for s in raw)):
                raise AuthError(401, "invalid bearer token: 'scopes' must be a list of strings")
            return raw
        raw = claims.get("scope", "")
        if not isinstance(raw, str):
            raise AuthError(401, "invalid bearer token: 'scope' must be a space-separated string")
        return raw.split()


def _subject(claims: dict[str, Any]) -> str:
    """A pseudonym of the token's ``sub`` (which must be a string, RFC 7519 StringOrURI)."""
    if not isinstance(claims["sub"], str) or not claims["sub"]:
        raise AuthError(401, "invalid bearer token: 'sub' must be a non-empty string")
    return hashlib.sha256(claims["sub"].encode()).hexdigest()[:12]


#: The two ways to present a credential, declared in the OpenAPI document (``securitySchemes``, and
#: ``security`` on every route that needs one) so the ``/docs`` page's *Authorize* button sends them.
#: They only document: :func:`authorize` reads the headers itself (``auto_error=False``).
API_KEY_SCHEME = APIKeyHeader(name="X-API-Key", scheme_name="ApiKey", auto_error=False,
                              description="An API key (`python -m flows.serve keys add`).")
BEARER_SCHEME = HTTPBearer(scheme_name="Bearer", bearerFormat="API key or JWT", auto_error=False,
                           description="`Authorization: Bearer <API key or JWT>` (JWT: HS256/RS256 per the settings).")
_DOCUMENTED = (Security(API_KEY_SCHEME), Security(BEARER_SCHEME))


def require_scope(scope: str) -> Callable[[Request], Any]:
    """A FastAPI dependency: the authenticated :class:`Principal` holding ``scope``.

    401 without or with a bad credential, 403 without the scope, 429 (``Retry-After``) over the
    key's rate limit, 503 when the rate limiter's store (Redis) cannot be reached (fail closed). The principal is also left on ``request.state.principal`` for the audit.
    """
    check_scopes([scope])

    async def dependency(request: Request, _key: Any = _DOCUMENTED[0], _bearer: Any = _DOCUMENTED[1]) -> Principal:
        return await authorize(request, lambda principal: principal.allows(scope), scope,
                               f"this credential lacks the scope {scope!r}")

    dependency.__name__ = f"require_{scope.replace(':', '_')}"
    return dependency


def require_any_scope(prefix: str) -> Callable[[Request], Any]:
    """A FastAPI dependency for routes whose scope depends on the request (``kb:<collection>:read``):
    the authenticated :class:`Principal` holding at least one scope starting with ``prefix`` (or
    ``admin``), rate-limited like :func:`require_scope`. The route checks the exact scope itself
    with :meth:`Principal.allows` once it has read the request."""

    def holds(principal: Principal) -> bool:
        return ADMIN in principal.scopes or any(s.startswith(prefix) for s in principal.scopes)

    async def dependency(request: Request, _key: Any = _DOCUMENTED[0], _bearer: Any = _DOCUMENTED[1]) -> Principal:
        return await authorize(request, holds, prefix.rstrip(":"), f"this credential holds no {prefix}* scope")

    dependency.__name__ = f"require_any_{prefix.replace(':', '_')}"
    return dependency


#: Set on a request's state once its credential's rate limit counted it (the middleware counts the
#: requests that end before any route dependency did: a 404, a malformed body).
RATE_COUNTED = "rate_counted"
AUTH_HEADERS = {"WWW-Authenticate": "Bearer, ApiKey"}


async def authenticate_request(services: Any, request_scope: dict[str, Any], headers: Any) -> Principal:
    """The caller of a request, or HTTPException: 401 (``WWW-Authenticate``) for a missing or bad
    credential, counted against the client address's own limit (429 above it)."""
    try:
        return services.auth.authenticate(headers.get("x-api-key"), headers.get("authorization"))
    except AuthError as exc:
        # requests without a valid credential count against their client address's own limit
        await count_request(services, f"unauthenticated:{client_address(request_scope)}",
                            services.tuning.unauthenticated_rate_limit, "unauthenticated")
        raise HTTPException(exc.status, str(exc), headers=AUTH_HEADERS) from None


async def authorize(request: Request, allowed: Callable[[Principal], bool], scope: str, refusal: str) -> Principal:
    """Authenticate the caller (the middleware did, before the body was read, on the API's paths),
    check ``allowed(principal)`` (403 ``refusal`` if not) and count the request against its rate
    limit (``scope`` labels the refusal metric)."""
    services = request.app.state.serving
    principal = getattr(request.state, "principal", None)
    if principal is None:
        principal = await authenticate_request(services, request.scope, request.headers)
    request.state.principal = principal
    setattr(request.state, RATE_COUNTED, True)
    await count_request(services, principal.key_id, principal.rate_limit, scope)  # a refused scope counts too
    if not allowed(principal):
        raise HTTPException(403, refusal)
    return principal


def client_address(scope: dict[str, Any]) -> str:
    """The peer address of a request (``unknown`` without one, e.g. in-process test clients)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def count_request(services: Any, key: str, rate: str | None, label: str) -> None:
    """Count one request of ``key`` against ``rate``: 429 (``Retry-After``) over it, 503 when the
    counter store is down (refused, never unlimited)."""
    try:
        decision = await services.limiter.hit(key, rate)
    except Exception as exc:  # noqa: BLE001 - the counter store (Redis) is down: refuse, do not go unlimited
        log.error("rate limiter unavailable: %s", type(exc).__name__)
        raise HTTPException(503, "the rate limiter is unavailable; retry later",
                            headers={"Retry-After": "5"}) from None
    if not decision.allowed:
        services.metrics.rate_limited.labels(scope=label).inc()
        raise HTTPException(
            429, f"rate limit of {decision.limit} requests exceeded; retry in {decision.retry_after_s} s",
            headers={"Retry-After": str(decision.retry_after_s), "X-RateLimit-Limit": str(decision.limit),
                     "X-RateLimit-Remaining": "0"},
        )
