"""Registered models loaded once per worker process, from the version a flow resolved.

A batch-scoring flow resolves ``NAME`` (its champion) to one exact :class:`~infra.registry.ModelRef`
when the run starts and hands that reference to every per-file task. A worker (a thread of
the flow's process, or a Dask worker process on another machine) loads the version from the
reference's absolute path — never from its own settings — and keeps it for the next files
of the run and of later runs: the key is the version folder and its weights' size and time,
and a registered version never changes.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from infra.errors import InfrastructureError
from infra.registry import META_FILE, ModelRef

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Versions kept loaded per process (a run uses one; a champion change brings a second).
MAX_LOADED = 4

_loaded: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_lock = threading.Lock()


def reachable_version(ref: ModelRef) -> Path:
    """The version folder of ``ref`` as this worker sees it; raises
    :class:`InfrastructureError` (retry, never blame the input) when it cannot be read."""
    folder = Path(ref.path)
    if not (folder / META_FILE).is_file():
        raise InfrastructureError(
            f"this worker ({socket.gethostname()}) cannot reach model {ref.spec} at {folder}: every worker "
            "must see the flow's home (INDUSFLOW_HOME on a shared volume, mounted at the same path)"
        )
    return folder


def load_once(ref: ModelRef, loader: Callable[[ModelRef], T]) -> T:
    """``loader(ref)``, computed once per process for a version and loader, then reused."""
    folder = reachable_version(ref)
    weights = ref.weights_path
    stamp = (weights.stat().st_size, weights.stat().st_mtime_ns) if weights.exists() else None
    key = (str(folder), ref.name, ref.version, stamp, f"{loader.__module__}.{loader.__qualname__}")
    with _lock:  # one load at a time: threads of one process wait for the first load, then share it
        if key in _loaded:
            _loaded.move_to_end(key)
            return _loaded[key]
        value = loader(ref)
        _loaded[key] = value
        while len(_loaded) > MAX_LOADED:
            _loaded.popitem(last=False)
    log.info("loaded %s for scoring in this worker", ref.spec)
    return value


def clear_loaded_models() -> None:
    """Forget every loaded model (tests, benchmarks)."""
    with _lock:
        _loaded.clear()
