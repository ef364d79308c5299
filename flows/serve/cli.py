"""``python -m flows.serve``: run the REST API; ``python -m flows.serve keys``: manage API keys.

The server is not a Prefect flow, so this module does not go through the flow generator of
:mod:`flows.cli`; it keeps its conventions: ``--help``, ``--json`` (one JSON object on the
last line of stdout), and a user error exits 2 with one ``error: ...`` line, no traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import threading
import time
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from flows.cli import UserError
from infra.errors import IndusflowError

log = logging.getLogger(__name__)

DESCRIPTION = """Serve the registered champions over HTTP (fraud scoring, sensor prediction) and the
knowledge base (/v1/kb: search, cited answers, document uploads; collections INDUSFLOW_KB_COLLECTIONS).

  python -m flows.serve [--host 127.0.0.1] [--port 8000]   run the API (docs at /docs)
  python -m flows.serve keys add NAME --scope fraud:score   create an API key (shown once)
  python -m flows.serve keys add NAME --scope kb:legal:read  a key that may search/ask collection legal
  python -m flows.serve keys list | keys revoke KEY_ID      list keys (no secrets), revoke one

Settings: INDUSFLOW_SERVE_* (docs/configuration.md); keys live hashed under <home>/serving/."""


#: Every scope a route of the API checks (flows/serve/{fraud,sensor,app}.py; ``admin`` grants all):
#: ``keys add`` refuses another, so a typo is caught when the key is made, not on its first 403.
KNOWN_SCOPES = ("fraud:score", "fraud:label", "sensor:predict", "metrics:read", "registry:approve", "admin")
#: Knowledge-base scopes name a collection: ``kb:<collection>:read``, ``:write`` or ``:source`` (original files).
KB_SCOPES = ("kb:<collection>:read", "kb:<collection>:write", "kb:<collection>:source")
#: Approval of one registry model's alias moves (flows/serve/registry.py).
MODEL_SCOPES = ("registry:approve:<model>",)
_KB_SCOPE = re.compile(r"^kb:(?P<collection>[^:]*):(?P<action>[^:]*)$")
_COLLECTION = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def check_known_scopes(scopes: Sequence[str]) -> None:
    """Each scope is one the API checks, or a knowledge-base scope on a well-formed collection
    name; ``UserError`` names the bad one and the known scopes."""
    known = ", ".join(KNOWN_SCOPES + KB_SCOPES + MODEL_SCOPES)
    for scope in scopes:
        if scope in KNOWN_SCOPES or scope.startswith("registry:approve:"):  # the model name: check_scopes
            continue
        kb = _KB_SCOPE.match(scope)
        if kb is None:
            raise UserError(f"--scope {scope!r}: unknown scope; known scopes: {known}")
        if kb["action"] not in ("read", "write", "source"):
            raise UserError(f"--scope {scope!r}: a knowledge-base scope ends in :read, :write or :source "
                            f"({', '.join(KB_SCOPES)})")
        if not _COLLECTION.match(kb["collection"]):
            raise UserError(f"--scope {scope!r}: collection {kb['collection']!r} is not a collection name "
                            "(a lower-case letter, then up to 39 lower-case letters, digits or _)")


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def server_parser() -> argparse.ArgumentParser:
    """Flags of the server command."""
    parser = _ArgParser(prog="python -m flows.serve", description=DESCRIPTION,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", help="address to bind (default: INDUSFLOW_SERVE_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default: INDUSFLOW_SERVE_PORT, 8000)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes (default: 1; rate limits are shared between them only "
                        "through Redis; the fraud feature state only through Redis (its embedded RocksDB store is "
                        "one process's), where one account's concurrent requests may be applied out of order "
                        "and refused (409); the embedded Milvus Lite file needs one process)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                        help="uvicorn log level (default: warning)")
    parser.add_argument("--access-log", action="store_true",
                        help="uvicorn's access log on stdout (the audit log records every request anyway)")
    return parser


def keys_parser() -> argparse.ArgumentParser:
    """Flags of ``keys add|list|revoke``."""
    parser = _ArgParser(prog="python -m flows.serve keys", description="Manage the API's keys (stored hashed).")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = sub.add_parser("add", help="create a key and print it once")
    add.add_argument("name", help="who or what the key is for (a label, not a secret)")
    add.add_argument("--scope", dest="scopes", action="append", required=True, metavar="SCOPE",
                     help="a scope it grants (repeat): fraud:score, fraud:label, sensor:predict, metrics:read, registry:approve, "
                     "registry:approve:<model>, kb:<collection>:read, kb:<collection>:write, kb:<collection>:source "
                     "(knowledge base, e.g. kb:legal:read), admin")
    add.add_argument("--person", help="bind the key to this person: the registry's approval route then carries "
                     "only decisions this person signed")
    add.add_argument("--rate-limit", metavar="N/PERIOD",
                     help="its own rate limit, e.g. 100/minute (default: INDUSFLOW_SERVE_DEFAULT_RATE_LIMIT)")
    add.add_argument("--json", action="store_true", help="print the result as one JSON object")
    lst = sub.add_parser("list", help="list keys (ids, names, scopes; never the keys)")
    lst.add_argument("--json", action="store_true", help="print the result as one JSON object")
    rev = sub.add_parser("revoke", help="revoke a key by id")
    rev.add_argument("key_id", help="the key's id (from keys list)")
    rev.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser


def _public(record: Any) -> dict[str, Any]:
    return record.model_dump(include={"key_id", "name", "scopes", "rate_limit", "person", "created_by", "created_at",
                                      "revoked_at"})


def run_keys(argv: Sequence[str]) -> int:
    """``keys add|list|revoke``."""
    from infra.home import home_layout
    from infra.serving.auth import check_scopes
    from infra.serving.runtime import key_store

    args = keys_parser().parse_args(argv)
    if args.action == "add":
        try:
            check_scopes(args.scopes)  # the syntax first (area:action)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        check_known_scopes(args.scopes)
    store = key_store(home_layout())
    if args.action == "add":
        try:
            key, record = store.add(args.name, args.scopes, args.rate_limit, person=args.person)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        print(f"API key {record.key_id} ({record.name}; scopes: {', '.join(record.scopes)}; "
              f"rate limit: {record.rate_limit or 'default'})")
        print("Store it now: it is not saved and cannot be shown again.")
        print(key)
        result: dict[str, Any] = {**_public(record), "key": key}
    elif args.action == "list":
        records = store.list()
        for r in records:
            state = f"revoked {r.revoked_at}" if r.revoked_at else "active"
            print(f"{r.key_id}  {r.name:<24} {','.join(r.scopes):<32} {r.rate_limit or 'default':<12} {state}")
        if not records:
            print("no API keys (add one with: python -m flows.serve keys add NAME --scope fraud:score)")
        result = {"keys": [_public(r) for r in records]}
    else:
        try:
            record = store.revoke(args.key_id)
        except KeyError as exc:
            raise UserError(str(exc.args[0])) from None
        print(f"revoked {record.key_id} ({record.name})")
        result = _public(record)
    if args.json:
        sys.stdout.flush()
        print(json.dumps(result, separators=(",", ":")))
    return 0


#: How long the start-up announcement waits for the models' first load (seconds).
ANNOUNCE_WAIT_S = 60.0


def announce(url: str, wait_s: float = ANNOUNCE_WAIT_S, poll_s: float = 0.25) -> str | None:
    """Log (INFO, logger ``flows.serve``) one line once the server answers: where it listens and
    the models it loaded (``name:version``), or why one is not loaded yet. Returns the line."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + wait_s
    body: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 503: answering, a model still loading
            body = json.loads(exc.read() or b"{}")
        except (OSError, ValueError):
            body = None  # not listening yet
        if body is not None and "loading" not in (body.get("waiting") or {}).values():
            break  # every model loaded, or its slot says why not
        time.sleep(poll_s)
    if body is None:
        return None
    waiting = body.get("waiting") or {}
    models = [f"{name}:{version}" if version is not None else f"{name}:none ({waiting.get(name, 'loading')})"
              for name, version in (body.get("models") or {}).items()]
    line = f"serving on {url} (docs {url}/docs); models: {', '.join(models) or 'none'}"
    log.info(line)
    return line


def _log_to_stderr() -> None:
    """The ``flows.serve`` logger at INFO on stderr (uvicorn's own log level stays as asked)."""
    logger = logging.getLogger("flows.serve")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False  # once: a handler the app's imports give the root logger would repeat it
    logger.setLevel(logging.INFO)


def run_server(argv: Sequence[str]) -> int:
    """Run uvicorn on the app (blocks until stopped)."""
    import uvicorn

    from infra.serving.middleware import parse_networks
    from infra.serving.protocol import GuardedHttpProtocol
    from infra.settings import get_serve_settings
    from solutions.rag.collections import configured_collections

    args = server_parser().parse_args(argv)
    settings = get_serve_settings()
    parse_networks(settings.allowed_networks())
    configured_collections()  # a bad INDUSFLOW_KB_COLLECTIONS stops here with one error line
    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: not a TCP port")
    if args.workers < 1:
        raise UserError("--workers must be at least 1")
    if args.workers > 1 and settings.fraud_model and not settings.redis_url:
        raise UserError(f"--workers {args.workers}: the fraud feature state's embedded store (RocksDB) serves one "
                        "process; set INDUSFLOW_SERVE_REDIS_URL to share it between worker processes")
    _log_to_stderr()
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
    threading.Thread(target=announce, args=(f"http://{shown}:{port}",), name="announce", daemon=True).start()
    uvicorn.run("flows.serve.app:create_app", factory=True, host=host, port=port, workers=args.workers,
                log_level=args.log_level, access_log=args.access_log, proxy_headers=False,
                http=GuardedHttpProtocol)  # header deadline and size cap (infra.serving.protocol)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``keys ...`` or the server."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["keys"]:
            return run_keys(argv[1:])
        return run_server(argv)
    except (IndusflowError, ValueError) as exc:
        message = str(exc)
        if isinstance(exc, ValidationError):
            message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
        return 2
