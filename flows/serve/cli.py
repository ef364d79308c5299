"""``python -m flows.serve``: run the REST API; ``python -m flows.serve keys``: manage API keys.

The server is not a Prefect flow, so this module does not go through the flow generator of
:mod:`flows.cli`; it keeps its conventions: ``--help``, ``--json`` (one JSON object on the
last line of stdout), and a user error exits 2 with one ``error: ...`` line, no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from flows.cli import UserError
from infra.errors import IndusflowError

DESCRIPTION = """Serve the registered champions over HTTP (fraud scoring, sensor prediction) and the
knowledge base (/v1/kb: search, cited answers, document uploads; collections INDUSFLOW_KB_COLLECTIONS).

  python -m flows.serve [--host 127.0.0.1] [--port 8000]   run the API (docs at /docs)
  python -m flows.serve keys add NAME --scope fraud:score   create an API key (shown once)
  python -m flows.serve keys add NAME --scope kb:legal:read  a key that may search/ask collection legal
  python -m flows.serve keys list | keys revoke KEY_ID      list keys (no secrets), revoke one

Settings: INDUSFLOW_SERVE_* (README, Configuration); keys live hashed under <home>/serving/."""


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
                        help="worker processes (default: 1; rate limits and feature state are shared "
                        "between them only through Redis)")
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
                     help="a scope it grants (repeat): fraud:score, fraud:label, sensor:predict, metrics:read, "
                     "kb:<collection>:read, kb:<collection>:write (knowledge base, e.g. kb:legal:read), admin")
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
    return record.model_dump(include={"key_id", "name", "scopes", "rate_limit", "created_at", "revoked_at"})


def run_keys(argv: Sequence[str]) -> int:
    """``keys add|list|revoke``."""
    from infra.home import home_layout
    from infra.serving.runtime import key_store

    args = keys_parser().parse_args(argv)
    store = key_store(home_layout())
    if args.action == "add":
        try:
            key, record = store.add(args.name, args.scopes, args.rate_limit)
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


def run_server(argv: Sequence[str]) -> int:
    """Run uvicorn on the app (blocks until stopped)."""
    import uvicorn

    from infra.serving.middleware import parse_networks
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
    uvicorn.run("flows.serve.app:create_app", factory=True, host=host, port=port, workers=args.workers,
                log_level=args.log_level, access_log=args.access_log, proxy_headers=False)
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
