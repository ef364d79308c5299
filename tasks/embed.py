"""Embed texts in batches (with a progress bar)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from infra.embeddings import Embedder

log = logging.getLogger(__name__)


def embed_texts(embedder: Embedder, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
    """L2-normalised vectors of ``texts`` (``float32``, one row per text)."""
    started = time.perf_counter()
    vectors = embedder.encode(list(texts), batch_size=batch_size, progress=progress)
    if len(texts):
        log.info("embedded %d texts in %.1f s", len(texts), time.perf_counter() - started)
    return vectors


embed_texts_task = task(name="embed-chunks", cache_policy=NONE)(embed_texts)
