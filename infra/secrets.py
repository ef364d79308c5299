"""The secrets boundary: keys, tokens and credentials in URLs never reach an error message, a
log, an artifact or a job variable.

- :func:`scrub` removes them from any text (an HTTP error body that echoes the request, an
  exception message of a client library): ``Authorization``/``Bearer``/``Basic`` values,
  ``user:password@`` in URLs, ``key=``/``token=``/``password=``-style pairs (query strings,
  JSON, headers), ``sk-...``-style API keys, and the values the caller knows are secret, also
  when an echo shows them escaped: JSON-escaped (``\\/``, ``\\uXXXX``), URL-encoded (either
  hex case, ``+`` for a space) or base64 (standard or URL-safe, padded or not, also inside a
  longer encoded value such as a ``Basic`` credential).
- :class:`UpstreamError` is what those clients raise: its message (for logs) is scrubbed, its
  :meth:`~UpstreamError.public_text` (for API callers) names the service and its status only.
- :func:`http_error_text` is what every HTTP client of the project puts into its exceptions:
  the status and a short, scrubbed excerpt of the body.
- :func:`url_credentials` tells whether a value carries credentials in a URL (``apply`` refuses
  to forward such a value into job variables).
- :func:`shareable_settings` picks the ``INDUSFLOW_*`` settings of an environment that may be
  written where others read them (deployment job variables, a Ray job's ``runtime_env``).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import html.entities
import itertools
import math
import os
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from infra.errors import IndusflowError

MASK = "***"


class UpstreamError(IndusflowError):
    """A failure of a service this process calls (an LLM, embeddings, Tika or Milvus server).

    Its message is for logs (scrubbed, with an excerpt of what the service answered); an API
    caller sees :meth:`public_text` only: the service and its status, never its body, which may
    echo the request (the key included) in an encoding no scrubber foresaw.

    Attributes:
        status: the service's HTTP status when it answered one, else None.
        upstream: whether the message quotes the service (False for a local failure of the same
            kind, e.g. an embedding model that cannot be loaded: its message is shown as is).
    """

    service = "an upstream service"

    def __init__(self, message: str, status: int | None = None, *, upstream: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.upstream = upstream

    def public_text(self) -> str:
        """What an API caller may see."""
        if not self.upstream:
            return " ".join(str(self).split())
        if self.status is not None:
            return f"{self.service} answered HTTP {self.status}"
        return f"{self.service} failed"
_MIN_SECRET = 4  # shorter "secrets" would mask ordinary words

_AUTH = re.compile(r"(?i)\b(authorization|proxy-authorization)(\"?\s*[:=]\s*\"?)(?:(bearer|basic|token|apikey)\s+)?"
                   r"[^\s\"',;}]+")
_SCHEME = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/\s:@\"']+)(?::[^/\s@\"']*)?@")
_PAIR = re.compile(
    r"(?i)([\"']?\b[\w-]*(?:api[_-]?key|apikey|access[_-]?key|secret|token|passw(?:or)?d|pwd|credential|signature|sig)"
    r"[\w-]*[\"']?\s*[:=]\s*[\"']?)([^\s\"'&,;}]+)"
)
_KEY_SHAPES = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{12,}|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{20,}\b"
                         r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")


_MIN_BASE64 = 8  # shorter base64 fragments would mask ordinary words


def _base64_forms(secret: str) -> set[str]:
    """The base64 text that ``secret``'s bytes give wherever they sit in an encoded value: for each
    of the 3 alignments, the characters that depend on the secret's bytes only."""
    raw = secret.encode("utf-8")
    forms: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode("ascii")
        part = encoded[math.ceil(8 * offset / 6): (8 * (offset + len(raw))) // 6]
        if len(part) >= _MIN_BASE64:
            forms |= {part, part.translate(str.maketrans("+/", "-_"))}
    return forms


def _hex_class(byte: int) -> str:
    return "".join(f"[{d.upper()}{d.lower()}]" if d.isalpha() else d for d in f"{byte:02x}")


@functools.cache
def _html_names() -> dict[str, tuple[str, ...]]:
    """Each character's named HTML entities (``&sol;`` for ``/``), with and without the ``;``."""
    names: dict[str, list[str]] = {}
    for name, char in html.entities.html5.items():
        if len(char) == 1:
            names.setdefault(char, []).append(name)
    return {char: tuple(sorted(found, key=len, reverse=True)) for char, found in names.items()}


def _char_forms(ch: str) -> list[str]:
    """The patterns one character of a secret may take in an echo: itself, JSON-escaped
    (``\\/``, ``\\uXXXX``), URL-encoded once or more (``%2F``, ``%252F``, either hex case, ``+``
    for a space), an HTML entity (``&#47;``, ``&#x2F;``, ``&sol;``, its ``&`` also as ``\\u0026``)."""
    amp = r"(?:&|\\u0026)"
    hex_digits = "".join(f"[{d.upper()}{d.lower()}]" if d.isalpha() else d for d in f"{ord(ch):x}")
    options = [re.escape(ch), "".join(f"%(?:25)*{_hex_class(b)}" for b in ch.encode("utf-8")),
               rf"{amp}#0*{ord(ch)};?", rf"{amp}#[xX]0*{hex_digits};?"]
    options += [amp + re.escape(name) for name in _html_names().get(ch, ())]
    if len(ch.encode("utf-16-be")) == 2:
        options.append(r"\\u" + "".join(_hex_class(b) for b in ch.encode("utf-16-be")))
    if ch in '/"\\':
        options.append(re.escape("\\" + ch))
    if ch == " ":
        options.append(r"\+|%(?:25)*2[Bb]")
    return options


@functools.lru_cache(maxsize=64)
def _escaped_pattern(secret: str) -> re.Pattern[str]:
    """``secret`` with any of its characters escaped as :func:`_char_forms` says, in any mix."""
    first = re.escape(secret[0]) + r"%&\\+"  # what any form of the first character starts with: a fast refusal
    return re.compile(f"(?=[{first}])" + "".join("(?:" + "|".join(_char_forms(ch)) + ")" for ch in secret))


@functools.lru_cache(maxsize=64)
def secret_forms(secret: str) -> frozenset[str]:
    """``secret`` and its base64 forms (the JSON-escaped and URL-encoded ones are matched by
    :func:`_escaped_pattern`)."""
    forms = {secret}
    if len(secret) >= _MIN_BASE64:
        forms |= _base64_forms(secret)
    return frozenset(f for f in forms if len(f) >= _MIN_SECRET)


def configured_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secret values this process is configured with (every ``SecretStr`` setting of
    :mod:`infra.settings` set in ``environ``, default ``os.environ`` and the home's settings file), with the
    password and a token-like user name of a URL one: :func:`scrub` removes them from any text, whoever calls it."""
    env = os.environ if environ is None else environ
    from_file = _settings_file_secrets() if environ is None else {}
    found: list[str | None] = []
    for value in [*(env.get(name) for name in _secret_names()), *from_file.values()]:
        if not value:
            continue
        found.append(value)
        if "://" in value:
            with contextlib.suppress(ValueError):
                parts = urlsplit(value)
                found += [parts.password, parts.username if len(parts.username or "") >= 16 else None]
    return [v for v in found if v and len(v) >= _MIN_SECRET]


def _settings_file_secrets() -> dict[str, str]:
    from infra.settings import settings_file_secrets

    return settings_file_secrets()


@functools.cache
def _secret_names() -> frozenset[str]:
    from infra.settings import secret_variables

    return secret_variables()


def scrub(text: str, known: Iterable[str | None] = ()) -> str:
    """``text`` with every credential replaced by ``***`` (see the module docstring): the values
    in ``known`` and those this process is configured with (:func:`configured_secrets`)."""
    if not text:
        return text
    secrets = sorted({s for s in [*known, *configured_secrets()] if s and len(s) >= _MIN_SECRET}, key=len, reverse=True)
    for secret in secrets:
        text = _escaped_pattern(secret).sub(MASK, text.replace(secret, MASK))
    for form in sorted(set().union(*(secret_forms(s) for s in secrets)), key=len, reverse=True):
        text = text.replace(form, MASK)
    text = _AUTH.sub(lambda m: f"{m.group(1)}{m.group(2)}{(m.group(3) + ' ') if m.group(3) else ''}{MASK}", text)
    text = _SCHEME.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _PAIR.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return _KEY_SHAPES.sub(MASK, text)


def http_error_text(status: int, body: str | bytes | None, known: Iterable[str | None] = (), limit: int = 200) -> str:
    """``HTTP <status>: <body excerpt>`` for an exception message, scrubbed before and after it is cut
    (a key cut in half by the limit is still removed)."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    known = list(known)
    excerpt = scrub(scrub(body or "", known)[:limit], known)
    return f"HTTP {status}: {excerpt!r}" if excerpt else f"HTTP {status}"


def shown_url(url: str) -> str:
    """A URL for messages: no ``user:password@`` part, no query string or fragment."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub(url)
    if not parts.scheme or not parts.netloc:
        return scrub(url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}{parts.path}"


#: Words that make a query-string parameter or a path segment a credential (``?key=``, ``?auth=``,
#: ``?code=``, ``?access_token=``, ``?X-Amz-Signature=``, ``/token/<value>``): any word of its name,
#: split at ``_``, ``-``, ``.`` and case changes.
_QUERY_SECRET_WORDS = frozenset({"key", "apikey", "auth", "authorization", "token", "secret", "password", "passwd",
                                 "pwd", "pass", "credential", "credentials", "signature", "sig", "session", "jwt",
                                 "code"})
#: A path segment that looks like a key: long, and mixing upper case, lower case and digits (UUIDs
#: and model names do not).
_RANDOM_SEGMENT = re.compile(r"(?=[A-Za-z0-9_-]*[A-Z])(?=[A-Za-z0-9_-]*[a-z])(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{24,}")


def _secret_words(name: str) -> bool:
    words = re.split(r"[_.\-]+|(?<=[a-z])(?=[A-Z])", name)
    return any(w.lower() in _QUERY_SECRET_WORDS for w in words if w)


def _query_secret(query: str) -> bool:
    return any(_secret_words(name) for name, _ in parse_qsl(query, keep_blank_values=True)) or bool(_PAIR.search(query))


def _path_secret(path: str) -> bool:
    """A key in a URL's path: a known key shape, a segment after one named like a credential
    (``/key/<value>``), or a long random-looking segment."""
    segments = [unquote(s) for s in path.split("/") if s]
    if any(_KEY_SHAPES.search(s) or _RANDOM_SEGMENT.fullmatch(s) for s in segments):
        return True
    return any(_secret_words(name) and len(value) >= 8 and any(c.isdigit() for c in value)
               for name, value in itertools.pairwise(segments))


def url_credentials(value: str) -> str | None:
    """What secret a value carries in a URL (``"password"``, ``"token"``, ``"query"``, ``"path"``), or None.

    Any ``scheme://user:password@host`` or ``scheme://token@host`` (also inside a longer value
    such as a list of URLs), a query string with a credential-named parameter (``key``, ``auth``,
    ``code``, ``token``, ``sig``, ...: :data:`_QUERY_SECRET_WORDS`, or a ``...api_key``/``...secret``-
    style name) and a key in the path (:func:`_path_secret`) count.
    """
    for m in re.finditer(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s,;]+", value):
        url = m.group(0)
        try:
            parts = urlsplit(url)
        except ValueError:
            return "malformed URL"
        if parts.password or re.match(r"[^/@]*:[^/@]*@", parts.netloc):
            return "password"
        if "@" in parts.netloc:
            return "token"  # a bare token as the user name (https://<token>@host)
        if _query_secret(parts.query or ""):
            return "query"
        if _path_secret(parts.path or ""):
            return "path"
    return None


#: Parts of a variable name that make it a secret whatever the settings classes say.
SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH", "SALT")


def shareable_settings(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The ``INDUSFLOW_*`` settings of ``environ`` that may be written into a configuration that
    others can read (Prefect job variables, a Ray job's ``runtime_env``), and the names of those
    refused because a URL in their value carries a credential (``"NAME (password in its URL)"``).

    Never shared: a setting that :mod:`infra.settings` holds as a secret (``SecretStr``), except a
    URL one (the tuning store, Redis) whose value carries no credential, and any variable named
    like a secret (:data:`SECRET_NAME_PARTS`). Values are never part of the refusals.
    """
    from infra.settings import secret_variables

    secret = {name for name in secret_variables() if not name.endswith("_URL")}
    keep: dict[str, str] = {}
    refused: list[str] = []
    for key, value in sorted(environ.items()):
        if not key.startswith("INDUSFLOW_") or key in secret or any(s in key for s in SECRET_NAME_PARTS):
            continue
        what = url_credentials(value)
        if what:
            refused.append(f"{key} ({what} in its URL)")
            continue
        keep[key] = value
    return keep, refused


#: What a child process that parses untrusted files inherits besides its own settings: the
#: system's basics, Python's, Prefect's and the numeric and model libraries' variables.
_CHILD_PREFIXES = ("PREFECT_", "PYTHON", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "OMP_", "MKL_", "OPENBLAS_",
                   "TORCH", "CUDA_", "NVIDIA_", "LC_", "XDG_")
_CHILD_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
                          "VIRTUAL_ENV", "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
                          "CURL_CA_BUNDLE", "NO_PROXY", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
                          "https_proxy"})


def child_environment(environ: Mapping[str, str], *, dropped: Iterable[str], secrets: Iterable[str] = ()
                      ) -> dict[str, str]:
    """The environment of a child process that handles untrusted input (an ingest parsing
    uploads): the ``INDUSFLOW_*`` settings except those under the ``dropped`` prefixes (e.g. the
    serving and LLM settings) and, of the secret ones, only the ``secrets`` named (the keys it needs
    for its work); and the system's, Python's, Prefect's and the numeric libraries' variables
    (:data:`_CHILD_NAMES`, :data:`_CHILD_PREFIXES`; named like a secret only for Prefect's API key).
    Nothing else: no key of another service, no JWT secret, no cloud credential of the shell."""
    from infra.settings import secret_variables

    needed = set(secrets)
    refused = secret_variables() - needed
    dropped = tuple(dropped)

    def wanted(name: str) -> bool:
        secret_like = any(part in name for part in SECRET_NAME_PARTS)
        if name.startswith("INDUSFLOW_"):
            return name in needed or not (name.startswith(dropped) or name in refused or secret_like)
        if name.startswith("PREFECT_"):
            return True
        return name in _CHILD_NAMES or (name.startswith(_CHILD_PREFIXES) and not secret_like)

    return {name: value for name, value in environ.items() if wanted(name)}
