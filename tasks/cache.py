"""The cache policies of the tasks that Prefect may skip on a re-run (their runs show as Cached).

A deterministic step that turns small inputs into a stored table caches on its inputs and its
source (``INPUTS + TASK_SOURCE``, Prefect's own policies), plus two keys of ours:

- :class:`SourceFiles`: a file named by a path input is keyed by what identifies its content
  cheaply (resolved path, size, modification time), so editing the file invalidates the cache;
- :class:`StoreHome`: the home folder, because a cached :class:`~tasks.data.DatasetRef` points
  at a file inside the home it was stored in (another home, another cache entry).

A :class:`~tasks.data.DatasetRef` input needs nothing more: Prefect hashes it as its JSON, which
holds its content hash. Results are stored as JSON (``result_serializer="json"``), never pickled.
A training or fine-tuning caches on its run key (:func:`training_run_policy`): the key names the
data and the configuration (same key = same run), and the models and loaders it takes are never
hashed; :func:`tasks.train.fit_once` loads a cached run's best weights into the model.
Exports and writes do not cache. Other tasks that take models, frames or clients never cache
(hashing them is slow or fails).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy
from prefect.utilities.hashing import hash_objects

from infra.home import home_layout

#: How the results of these tasks are stored: as JSON, never pickled.
RESULT_SERIALIZER = "json"


def file_identity(path: Path) -> tuple[str, int, int] | None:
    """``(resolved path, size, mtime in ns)`` of a file; None when there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


@dataclass
class SourceFiles(CachePolicy):
    """Keys on the identity of every file named by a ``Path`` input."""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        files = {name: file_identity(value) for name, value in (inputs or {}).items() if isinstance(value, Path)}
        return hash_objects(files, raise_on_failure=True) if files else None


@dataclass
class StoreHome(CachePolicy):
    """Keys on the home folder the task stores into."""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        return hash_objects(str(home_layout().root.resolve()), raise_on_failure=True)


def stored_table_policy(*unhashed: str) -> CachePolicy:
    """A deterministic step that stores a table: its inputs (less ``unhashed``, e.g. a build
    callable the other inputs already describe), its source, its input files and the home."""
    inputs: CachePolicy = INPUTS
    for name in unhashed:
        inputs = inputs - name
    return TASK_SOURCE + inputs + SourceFiles() + StoreHome()


@dataclass
class RunKey(CachePolicy):
    """Keys on the task's name and the ``run_key`` of its ``spec`` input (a training's identity);
    no spec, no key. The name keeps a fine-tuning and a training of one run key apart (their
    results differ in shape)."""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        run_key = getattr((inputs or {}).get("spec"), "run_key", None)
        return hash_objects(task_ctx.task.name, run_key, raise_on_failure=True) if run_key else None


def training_run_policy() -> CachePolicy:
    """A training: its run key and the home its checkpoints are in (never its model or data objects)."""
    return RunKey() + StoreHome()
