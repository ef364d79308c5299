"""What the knowledge base does to each document before it is embedded: the domain's part of
an ingestion, handed to the generic engine (``tasks.ingest``) as :class:`DocumentRules`.

Documents are redacted (compliance, see :mod:`solutions.rag.redact`) and cut into token
windows at sentence boundaries that know Chinese punctuation (:mod:`solutions.rag.text`). The
rules' ``key`` changes whenever anything that shapes the stored rows changes, so an unchanged
file is re-ingested exactly when its rows would differ.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from infra.store import stable_hash
from solutions.rag.config import ChunkParams, RedactionParams
from solutions.rag.redact import RedactionConfig, redact, redaction_fingerprint
from solutions.rag.text import sentence_spans

#: bumped when chunking or redaction changes how an unchanged file is stored, so that the next ingest
#: re-does every file (2: windows before a long sentence no longer repeat each other, ``tasks.chunk``;
#: 3: paginated documents are chunked page by page, so a passage has one page; .pptx slides are pages)
PIPELINE_VERSION = "3"


def pipeline_key(chunk: ChunkParams, redaction: RedactionParams, embedder_name: str) -> str:
    """Hash of everything that changes the stored rows of an unchanged file: chunking, the
    redaction kinds switched on and their rules (:func:`redaction_fingerprint`), the embedder."""
    rules = redaction_fingerprint(RedactionConfig(**redaction.model_dump()))
    return stable_hash({"chunk": chunk.model_dump(), "redaction": redaction.model_dump(), "redaction_rules": rules,
                        "embedder": embedder_name, "v": PIPELINE_VERSION})


@dataclass(frozen=True)
class DocumentRules:
    """Redaction and chunking of the knowledge base (satisfies ``tasks.ingest.DocumentRules``).

    Attributes:
        key: :func:`pipeline_key` of these rules and the embedder.
        chunk_tokens: Window size in tokens.
        chunk_overlap: Tokens shared by consecutive windows.
        redaction: The redaction kinds switched on.
    """

    key: str
    chunk_tokens: int
    chunk_overlap: int
    redaction: RedactionConfig

    def redact(self, text: str) -> tuple[str, Counter]:
        """``text`` with personal data replaced by placeholders, and the count per kind."""
        return redact(text, self.redaction)

    def sentences(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the sentences of ``text`` (window cuts fall between them)."""
        return sentence_spans(text)


def document_rules(chunk: ChunkParams, redaction: RedactionParams, embedder_name: str,
                   window: int | None = None) -> DocumentRules:
    """The rules of an ingestion with these parameters and this embedder.

    ``window`` (content tokens the embedder sees at once, see ``tasks.chunk.embedder_window``)
    fills in a chunk size or overlap left unset.
    """
    if chunk.tokens is None or chunk.overlap is None:
        if window is None:
            raise ValueError("the chunk size follows the embedder's window: pass window= or set the chunk tokens")
        chunk = chunk.resolved(window)
    assert chunk.tokens is not None and chunk.overlap is not None
    return DocumentRules(key=pipeline_key(chunk, redaction, embedder_name), chunk_tokens=chunk.tokens,
                         chunk_overlap=chunk.overlap, redaction=RedactionConfig(**redaction.model_dump()))
