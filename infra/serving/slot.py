"""A served model: the registry's champion, loaded in the background and hot-reloaded.

A :class:`ModelSlot` polls the registry's alias file; when the alias points at a new version it
loads that version in its own thread (requests keep being served by the old one), then swaps
one reference. A request takes ``(ref, model) = slot.current()`` once and uses that pair to the
end, so it finishes on the version it started with and its response names that version; the
old model is freed when the last request holding it returns. A version that fails to load is
logged and counted, the old one stays, and the next poll tries again.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from infra.registry import CHAMPION, ModelRef, ModelRegistry
from infra.serving.breaker import CircuitBreaker
from infra.serving.metrics import ServingMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")

#: One model loads at a time in the process. Loaders import torch, scikit-learn and scipy on
#: first use; two slot threads importing them at once can meet in the import system's deadlock
#: avoidance, which hands one of them a partially initialised module ("partially initialized
#: module 'torch' has no attribute 'Tensor'", "cannot import name 'BaseEstimator'"), seen in CI
#: when the fraud and sensor slots started together.
_LOAD_LOCK = threading.Lock()


def settle_heap() -> None:
    """Collect, then freeze what is alive (the libraries, the loaded models) out of the cyclic GC.

    Scoring a batch allocates many small objects (feature-state documents, row lists); each
    time the allocation count trips a full collection, the GC walks every object of torch,
    pandas and the model, which cost ~10 ms per 1,000-row request here (80 % of reading the
    state). Frozen objects are never walked again (their memory is still freed by reference
    counting); the earlier freeze is undone first, so a replaced version is collected.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def import_model_libraries(names: tuple[str, ...] = ("torch", "scipy.stats", "sklearn.base", "pandas")) -> None:
    """Import the libraries the loaders use, once, in the calling (main) thread.

    Done before the slot threads start, so no request thread (a KB search importing the
    embedding model) and no loader imports them concurrently for the first time; a library
    that is not installed is skipped (its vertical reports the error when it loads).
    """
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            log.debug("model library %s is not installed", name)


class ModelNotReady(Exception):
    """No version of the model is loaded yet (503 with ``Retry-After``)."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model} is not loaded: {detail}")
        self.model = model


class ModelSlot(Generic[T]):
    """One registry model behind an alias, ready to serve.

    Args:
        name: the registered model's name.
        loader: ``loader(ref) -> object`` builds what the routes call (network, preprocessor,
            threshold...) from a version; it runs in the slot's thread, never on a request.
        registry: the registry to read.
        alias: the alias followed (``champion``).
        poll_s: how often the alias is checked.
        metrics: where the version gauge, reloads and load errors go.
        breaker: the model's circuit breaker (routes wrap calls in ``slot.breaker.guard()``).
        optional: ``/readyz`` does not wait for it (a challenger alias that may be unset).
    """

    def __init__(self, name: str, loader: Callable[[ModelRef], T], *, registry: ModelRegistry,
                 alias: str = CHAMPION, poll_s: float = 5.0, metrics: ServingMetrics | None = None,
                 breaker: CircuitBreaker | None = None, optional: bool = False) -> None:
        self.name = name
        self.loader = loader
        self.registry = registry
        self.alias = alias
        #: readiness does not wait for an optional slot (a challenger: the alias may not be set)
        self.optional = optional
        #: metric label and log name: the model, or ``model@alias`` for an alias other than champion
        self.label = name if alias == CHAMPION else f"{name}@{alias}"
        self.poll_s = poll_s
        self.metrics = metrics
        self.breaker = breaker if breaker is not None else CircuitBreaker(name)
        self._current: tuple[ModelRef, T] | None = None
        self._failed: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._check_lock = threading.Lock()
        self.last_error: str | None = None

    # -- serving
    def current(self) -> tuple[ModelRef, T]:
        """The loaded ``(version, model)``; :class:`ModelNotReady` before the first load."""
        current = self._current
        if current is None:
            raise ModelNotReady(self.label, self.last_error or f"waiting for {self.name}@{self.alias}")
        return current

    @property
    def ready(self) -> bool:
        """True once a version is loaded."""
        return self._current is not None

    @property
    def version(self) -> int | None:
        """The loaded version, if any."""
        current = self._current
        return current[0].version if current else None

    # -- loading
    def check_now(self) -> bool:
        """Load the alias's version if it is not the one served; True when a new one was swapped in."""
        with self._check_lock:
            try:
                target = self.registry.aliases(self.name).get(self.alias)
            except Exception as exc:  # noqa: BLE001 - a broken registry must not kill the poller
                self.last_error = f"cannot read the registry: {type(exc).__name__}"
                log.warning("model %s: %s", self.label, self.last_error)
                return False
            if target is None:
                self.last_error = f"the registry has no {self.name}@{self.alias}"
                if self._current is not None and self.optional:  # a challenger alias cleared: stop serving it
                    log.info("model %s: alias removed, version %s no longer served", self.label, self.version)
                    self._current = None
                    if self.metrics is not None:
                        self.metrics.model_version.labels(model=self.label).set(0)
                return False
            if target == self.version:
                return False
            try:
                ref = self.registry.get(self.name, target)
                with _LOAD_LOCK:
                    model = self.loader(ref)
            except Exception as exc:
                first = target not in self._failed
                self._failed[target] = f"{type(exc).__name__}: {exc}"
                self.last_error = f"loading version {target} failed ({type(exc).__name__})"
                if self.metrics is not None and first:
                    self.metrics.model_errors.labels(model=self.label, stage="load").inc()
                log.log(logging.ERROR if first else logging.DEBUG, "model %s: loading version %s failed: %s",
                        self.label, target, exc, exc_info=first)
                return False
            previous = self.version
            self._current = (ref, model)  # one reference assignment: the swap is atomic
            self.last_error = None
            settle_heap()
            if self.metrics is not None:
                self.metrics.model_version.labels(model=self.label).set(ref.version)
                self.metrics.reloads.labels(model=self.label).inc()
            log.info("model %s: serving version %s (was %s)", self.label, ref.version, previous)
            return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.check_now()
            self._stop.wait(self.poll_s)

    def start(self) -> None:
        """Load the first version and follow the alias, in a daemon thread."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"slot-{self.label}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop following the alias (the loaded version stays usable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(self.poll_s, 1.0) + 30)
            self._thread = None
