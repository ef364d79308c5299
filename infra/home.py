"""The home layout: every folder the project writes, named in one place.

Everything the project writes lives under one home folder (``INDUSFLOW_HOME``). On a
multi-machine work pool the home is a shared volume (a docker named volume, a Kubernetes
ReadWriteMany PersistentVolumeClaim), so a training on one pod and a scoring run on another
see the same registry, ledgers and inboxes. Code asks :func:`home_layout` for a folder by
what it holds, never by a string literal::

    layout = home_layout()
    layout.scores("fraud-batch")       # <home>/scores/fraud-batch/
    layout.inbox("sensor")             # <home>/inbox/sensor/
    layout.new_report("fraud-train")   # <home>/reports/fraud-train-<timestamp>/

Each method creates its folder on first use and refuses a name that would leave the home.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from infra.store import check_name, safe_join


@dataclass(frozen=True)
class HomeLayout:
    """The folders under one home."""

    root: Path

    # -- plumbing
    def _area(self, *parts: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = safe_join(self.root, *parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- data
    def datasets(self) -> Path:
        """Validated input tables (Parquet, content-addressed)."""
        return self._area("datasets")

    def prepared(self) -> Path:
        """Derived tables (features, grids), content-addressed by their inputs and code version."""
        return self._area("prepared")

    def inbox(self, vertical: str) -> Path:
        """The watched folder of a vertical's batch job (``fraud``, ``sensor``, ``docs``)."""
        return self._area("inbox", check_name(vertical, "inbox name"))

    # -- training and models
    def checkpoints(self, run_key: str | None = None) -> Path:
        """Lightning checkpoints, one folder per run key (same key = same run, resumable)."""
        return self._area("checkpoints", check_name(run_key, "run key")) if run_key else self._area("checkpoints")

    def registry(self) -> Path:
        """The model registry: ``<model>/<version>/``."""
        return self._area("registry")

    def tuning(self) -> Path:
        """Optuna study databases (SQLite) when no shared database is configured."""
        return self._area("tuning")

    # -- outputs of runs
    def reports(self) -> Path:
        """Markdown reports and plots of every run."""
        return self._area("reports")

    def new_report(self, kind: str) -> Path:
        """A fresh report folder ``<kind>-<timestamp>`` for one run."""
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        return self._area("reports", check_name(f"{kind}-{stamp}", "report name"))

    def scores(self, flow: str | None = None) -> Path:
        """Score files: the root for one-off ``score`` runs, ``scores/<flow>/`` for batch jobs."""
        return self._area("scores", check_name(flow, "flow name")) if flow else self._area("scores")

    # -- batch jobs
    def ledgers(self) -> Path:
        """Processed-files ledgers of the batch jobs (``<job>.jsonl``)."""
        return self._area("ledgers")

    def quarantine(self, job: str) -> Path:
        """Files a batch job could not read or validate, with their reasons."""
        return self._area("quarantine", check_name(job, "job name"))

    # -- after deployment
    def monitoring(self, job: str) -> Path:
        """Monitoring tables of a job (drift per run, realised performance), ``monitoring/<job>/``."""
        return self._area("monitoring", check_name(job, "job name"))

    def accumulated(self, vertical: str) -> Path:
        """Scored data joined with its arrived labels, Parquet partitioned by day (``day=YYYY-MM-DD/``)."""
        return self._area("accumulated", check_name(vertical, "vertical name"))

    def batch_history(self, vertical: str) -> Path:
        """Transactions the batch job scored, the history of later files (``batch-history/<vertical>/``)."""
        return self._area("batch-history", check_name(vertical, "vertical name"))

    # -- knowledge base
    def milvus(self) -> Path:
        """Milvus Lite database files (the embedded vector store)."""
        return self._area("milvus")

    def rag(self) -> Path:
        """Ingest state of the knowledge base (manifests, quarantine caches)."""
        return self._area("rag")

    def kb_feedback(self) -> Path:
        """Votes on knowledge-base answers (one redacted JSONL file per collection, mode 0600)."""
        return self._area("rag", "feedback")

    def kb_glossaries(self) -> Path:
        """Glossaries of the knowledge-base collections (``<collection>.yaml`` or ``.csv``): outside
        every watched folder, so none is ingested as a document."""
        return self._area("rag", "glossary")

    def kb_inbox(self, collection: str) -> Path:
        """The watched folder of a knowledge-base collection: ``inbox/docs`` for ``default``, else ``inbox/kb/<name>``."""
        if collection == "default":
            return self.inbox("docs")
        return self._area("inbox", "kb", check_name(collection, "collection name"))

    def model_exports(self) -> Path:
        """ONNX / INT8 exports of local models (e.g. the embedder), one folder per model content and runtime."""
        return self._area("model-exports")

    # -- keys
    def secrets(self) -> Path:
        """Keys the project makes for itself (the path-tag key of the PII redactor), mode 0700."""
        path = self._area("secrets")
        path.chmod(0o700)
        return path

    # -- online serving
    def serving(self) -> Path:
        """State of the REST API: hashed API keys, the audit log, the audit salt, online feature state."""
        return self._area("serving")

    def kb_jobs(self) -> Path:
        """Ingest jobs started by the knowledge-base API (one JSON file per job, seen by every replica)."""
        return self._area("serving", "kb-jobs")

    def online_state(self) -> Path:
        """The embedded online feature state of the REST API (per-account/terminal history, RocksDB)."""
        return self._area("serving", "online-state")


def home_layout() -> HomeLayout:
    """The layout of the configured home (``INDUSFLOW_HOME``), read now."""
    from infra.settings import get_core_settings

    return HomeLayout(get_core_settings().resolved_home())
