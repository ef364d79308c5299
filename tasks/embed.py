"""Embed texts in batches (with a progress bar) and report how well the embedder covers a corpus."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict

from infra.embeddings import Embedder

log = logging.getLogger(__name__)

POOR_UNK_SHARE = 0.05
POOR_TRUNCATED_SHARE = 0.2


class CoverageReport(BaseModel):
    """How much of a corpus the embedding model actually sees."""

    model_config = ConfigDict(frozen=True)

    model: str
    texts: int
    tokens: int
    unk_share: float
    truncated_share: float
    window: int
    poor: bool
    advice: str = ""


def coverage_report(tokenizer: Any, texts: Sequence[str], window: int, model: str = "") -> CoverageReport:
    """Share of unknown word pieces and of texts longer than the model's window."""
    unk_id = getattr(tokenizer, "unk_token_id", None)
    tokens = unk = truncated = 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
        tokens += len(ids)
        if unk_id is not None:
            unk += sum(1 for i in ids if i == unk_id)
        truncated += len(ids) + 2 > window
    n = max(len(texts), 1)
    unk_share = unk / max(tokens, 1)
    trunc_share = truncated / n
    poor = unk_share > POOR_UNK_SHARE or trunc_share > POOR_TRUNCATED_SHARE
    advice = ""
    if unk_share > POOR_UNK_SHARE:
        advice += (f"{unk_share:.0%} of word pieces are unknown to {model or 'the embedder'}: dense retrieval will "
                   "be weak for this corpus; rely on BM25/hybrid or set INDUSFLOW_EMBED_MODEL to a local "
                   "multilingual model folder. ")
    if trunc_share > POOR_TRUNCATED_SHARE:
        advice += (f"{trunc_share:.0%} of chunks exceed the model's {window}-token window and are truncated "
                   "when embedded: lower --chunk-tokens.")
    if poor:
        log.warning("embedder coverage is poor: %s", advice.strip())
    return CoverageReport(model=model, texts=len(texts), tokens=tokens, unk_share=round(unk_share, 4),
                          truncated_share=round(trunc_share, 4), window=window, poor=poor, advice=advice.strip())


def embed_texts(embedder: Embedder, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
    """L2-normalised vectors of ``texts`` (``float32``, one row per text)."""
    started = time.perf_counter()
    vectors = embedder.encode(list(texts), batch_size=batch_size, progress=progress)
    if len(texts):
        log.info("embedded %d texts in %.1f s", len(texts), time.perf_counter() - started)
    return vectors


embed_texts_task = task(name="embed-chunks", cache_policy=NONE)(embed_texts)
coverage_report_task = task(name="embedder-coverage", cache_policy=NONE)(coverage_report)
