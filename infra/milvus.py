"""Milvus through ``pymilvus.MilvusClient``: an embedded Milvus Lite file by default, a server
URI (+ token) when configured. The chunk collection holds dense vectors and a BM25 sparse
field computed by Milvus from the text (analyzer ``jieba``, which also splits Latin words)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Any

# pymilvus sets up its loggers when it is imported, with ``logging.config.dictConfig``, which
# flushes and closes every handler of the process while holding the logging lock. Imported
# inside a flow run, that flush drains Prefect's API-log and events workers: the run stalls
# 5 s (the drain's timeout) and Prefect prints ``EventsWorker - Still processing items``.
# Imported here, with the flow modules, it runs before any flow run has started those workers.
import pymilvus  # noqa: F401

from infra.errors import IndusflowError
from infra.home import home_layout
from infra.secrets import scrub, shown_url
from infra.settings import MilvusSettings, get_milvus_settings
from infra.store import check_name

log = logging.getLogger(__name__)

TEXT_MAX_CHARS = 16000  # Milvus VARCHAR counts bytes: 16k characters stay under 65535 bytes
_VARCHAR = {"id": 128, "doc_id": 64, "content_hash": 64, "source": 2048, "source_hash": 64, "path": 2048,
            "title": 512, "author": 512, "content_type": 128, "language": 16, "created": 32, "modified": 32}
_INTS = ("chunk_index", "n_chunks", "n_docs", "created_ts", "modified_ts", "page", "start_char", "end_char",
         "tokens")
MANIFEST_FIELDS = ("id", "doc_id", "source", "source_hash", "n_chunks", "n_docs")


class VectorStoreError(IndusflowError):
    """Milvus refused an operation or the collection does not match what is asked."""


def default_collection(name: str | None = None) -> str:
    """``name``, or the configured default collection (``INDUSFLOW_MILVUS_COLLECTION``), checked."""
    return check_name(name or get_milvus_settings().collection, "collection name")


def lite_path(name: str = "rag") -> Path:
    """The default Milvus Lite file under the home folder."""
    return home_layout().milvus() / f"{check_name(name, 'database name')}.db"


def ignore_milvus_lite_pkg_resources_warning() -> None:
    """Ignore the ``pkg_resources is deprecated`` warning of milvus-lite's import, and only that.

    milvus-lite 2.5.1 (pinned for its C++ engine; no later 2.5 release) reads its own version
    with ``pkg_resources``, which setuptools 80 answers with a ``UserWarning`` on every command
    that opens a Lite file. Nothing a user can change: the filter names that one module.
    (Adding the same filter again replaces it: calling this per client keeps one entry.)
    """
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning,
                            module="milvus_lite")


def import_milvus_lite() -> None:
    """Import milvus-lite (once per process) with its ``pkg_resources`` warning ignored.

    Done when this module is imported, which the flow modules do in the main thread before any
    worker thread starts: ``warnings.catch_warnings`` in another thread (torch and scikit-learn
    use it while loading a model) restores the process-wide filter list when it exits, so a
    filter added beside it can vanish just before a request thread's first ``MilvusClient``
    imports milvus-lite, and the warning then reaches the log (a README ``flows.serve`` run in
    CI). Once imported, the module never warns again. Absent (no Lite wheel for the platform;
    a server URI works without it), nothing happens.
    """
    ignore_milvus_lite_pkg_resources_warning()
    try:
        import milvus_lite  # noqa: F401
    except ImportError:
        log.debug("milvus-lite is not installed; only a Milvus server URI works")


import_milvus_lite()


def open_client(settings: MilvusSettings | None = None, uri: str | None = None) -> Any:
    """A ``MilvusClient`` on the configured server, or the given/default Milvus Lite file."""
    from pymilvus import MilvusClient

    import_milvus_lite()

    settings = settings or get_milvus_settings()
    target = uri or settings.uri or str(lite_path())
    token = settings.token.get_secret_value() if settings.token else ""
    lite = "://" not in target and not target.startswith("unix:")
    if lite:
        Path(target).expanduser().parent.mkdir(parents=True, exist_ok=True)
    try:
        client = MilvusClient(uri=target, token=token) if token else MilvusClient(uri=target)
    except Exception as exc:  # noqa: BLE001 - pymilvus raises many kinds; each is named, scrubbed
        raise VectorStoreError(f"cannot open Milvus at {shown_url(target) if '://' in target else target}: "
                               f"{scrub(str(exc), [token])}"[:500]) from None
    if lite:
        owner_only(Path(target).expanduser())
    return client


def owner_only(db: Path) -> None:
    """Make a Milvus Lite file (the collections' text, redacted but private) and its lock file
    readable by their owner only: Milvus Lite creates them with the process's umask."""
    for path in (db, db.with_name(f".{db.name}.lock")):
        with contextlib.suppress(FileNotFoundError):
            path.chmod(0o600)


def shared_uri(client: Any) -> str | None:
    """The URI another process of this machine opens ``client``'s store with, when it is a Milvus
    Lite file: one process holds the file, and its Lite server listens on a Unix socket
    (``unix:/tmp/…sock``). None for a Milvus server (every process uses the configured URI)."""
    from pymilvus import connections

    try:
        address = str(connections.get_connection_addr(client._using).get("address", ""))
    except Exception:  # noqa: BLE001 - not a pymilvus client (a test double): nothing to share
        return None
    return address if address.startswith("unix:") else None


def row_count(client: Any, name: str) -> int | None:
    """How many rows ``name`` holds (Milvus's collection statistics; None if it cannot say)."""
    try:
        return int(client.get_collection_stats(name)["row_count"])
    except Exception as exc:  # noqa: BLE001 - a count is advisory: the caller does without
        log.debug("no row count for %s: %s", name, type(exc).__name__)
        return None


def ensure_collection(client: Any, name: str, dim: int, *, analyzer: str = "jieba") -> bool:
    """Create the chunk collection if missing; check its vector size if present.

    Returns:
        True when the collection was created now.
    """
    from pymilvus import DataType, Function, FunctionType

    check_name(name, "collection name")
    if client.has_collection(name):
        desc = client.describe_collection(name)
        for f in desc.get("fields", []):
            if f.get("name") == "vector":
                have = int(f.get("params", {}).get("dim", dim))
                if have != dim:
                    raise VectorStoreError(
                        f"collection {name!r} holds {have}-d vectors but the embedder makes {dim}-d ones; "
                        "use another --collection or the model it was built with"
                    )
        client.load_collection(name)
        return False
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=_VARCHAR["id"])
    for field, length in _VARCHAR.items():
        if field != "id":
            schema.add_field(field, DataType.VARCHAR, max_length=length)
    for field in _INTS:
        schema.add_field(field, DataType.INT64)
    schema.add_field(
        "text", DataType.VARCHAR, max_length=65535, enable_analyzer=True,
        analyzer_params={"tokenizer": analyzer},
    )
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_function(
        Function(name="text_bm25", function_type=FunctionType.BM25, input_field_names=["text"],
                 output_field_names=["sparse"])
    )
    index = client.prepare_index_params()
    index.add_index("vector", index_type="AUTOINDEX", metric_type="COSINE")
    index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
    client.load_collection(name)
    log.info("created collection %s (%d-d vectors + BM25/%s)", name, dim, analyzer)
    return True


def quote(value: str) -> str:
    """A string literal for a Milvus boolean expression."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def query_all(client: Any, name: str, fields: tuple[str, ...], expr: str = "", batch: int = 4000) -> list[dict]:
    """Every row matching ``expr`` (all rows when empty), paged by primary key."""
    rows: list[dict] = []
    last = ""
    while True:
        cond = f"id > {quote(last)}"
        if expr:
            cond = f"({expr}) and {cond}"
        page = client.query(name, filter=cond, output_fields=list(fields), limit=batch)
        if not page:
            return rows
        page.sort(key=lambda r: r["id"])
        rows.extend(page)
        last = page[-1]["id"]
        if len(page) < batch:
            return rows


# ------------------------------------------------------------------------------------
# who holds a Milvus Lite file

#: Where Linux lists the file locks of every process (``POSIX ADVISORY WRITE <pid> <dev>:<inode> ...``).
PROC_LOCKS = Path("/proc/locks")


def lite_lock_file(db: Path) -> Path:
    """The file milvus-lite locks while a process has ``db`` open (``.<name>.lock`` beside it)."""
    return db.parent / f".{db.name}.lock"


def lite_holder(db: Path) -> int | None:
    """The id of another process holding the Milvus Lite file ``db``, from ``/proc/locks``; None
    when no other process holds it or the system does not say (not Linux)."""
    import os

    try:
        st = lite_lock_file(db).stat()
        table = PROC_LOCKS.read_text()
    except OSError:
        return None
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == key and fields[4] != str(os.getpid()):
            return int(fields[4])  # "->" lines are processes waiting for the lock (milvus-lite's own engine)
    return None


def describe_process(pid: int) -> str:
    """``process <pid> (<its command line>)``, the command line cut to 120 characters."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        cmd = " ".join(Path(a.decode(errors="replace")).name if i == 0 else a.decode(errors="replace")
                       for i, a in enumerate(args) if a)
    except OSError:
        cmd = ""
    return f"process {pid}" + (f" ({cmd[:120]})" if cmd else "")


def lite_held(target: str) -> VectorStoreError | None:
    """The error to raise when ``target`` is a Milvus Lite file another process holds: it names
    the file, the process and what to do. None for a server URI or a free file."""
    if "://" in target or target.startswith("unix:"):
        return None
    db = Path(target).expanduser()
    pid = lite_holder(db)
    if pid is None:
        return None
    holder = describe_process(pid)
    ask = " (POST /v1/kb/ask with a kb key)" if "flows.serve" in holder else ""
    return VectorStoreError(
        f"the Milvus Lite file {db} is held by {holder}: one process opens a Lite file at a time. "
        f"Ask that server instead{ask}, or stop it (kill {pid}) and retry; "
        "or point both at a Milvus server (INDUSFLOW_MILVUS_URI=http://...)")


def check_lite_free(settings: MilvusSettings | None = None) -> None:
    """Pre-flight: the Milvus Lite file this process would open is not held by another process
    (one process opens a Lite file at a time). Nothing to check for a Milvus server URI.

    Raises:
        VectorStoreError: naming the file, the process that holds it and what to do.
    """
    settings = settings or get_milvus_settings()
    held = lite_held(settings.uri or str(lite_path()))
    if held is not None:
        raise held
