"""Language rules of the knowledge base: sentence boundaries (Chinese 。！？； and English),
and query terms for extractive answers (jieba for Chinese)."""

from __future__ import annotations

import logging
import re
import unicodedata
import warnings

# jieba 0.42 imports ``pkg_resources``, which setuptools 80 answers with a UserWarning the first
# time anything imports it; a filter set now (module import, main thread) ignores only that one
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning, module="jieba")

# A sentence ends after CJK terminal punctuation (closing quotes/brackets kept with it), after
# Latin terminal punctuation followed by whitespace, at a blank line, or at a line break that
# is not a hard wrap (see _ends_line).
_SENTENCE_END = re.compile(
    r"[。！？；!?;]+[”’」』）)\]\"']*"
    r"|(?<=[.])[”’\"')\]]*(?=\s)"
    r"|\n\s*\n"
    r"|(?P<line>\n)"
)
#: Lines shorter than this are headings, table cells or list lines, not a wrapped paragraph.
_SHORT_LINE = 40
_STOP = frozenset(
    ["the", "a", "an", "of", "to", "in", "on", "for", "and", "or", "is", "are", "was", "were", "be", "by", "with", "as", "at", "from", "that", "this", "what", "which", "who", "whom", "how", "why", "when", "where", "does", "do", "did", "的", "了", "是", "在", "和", "与", "及", "或", "吗", "呢", "什么", "哪", "哪个", "哪些", "多少", "为什么", "怎么", "如何", "谁", "几", "是否", "被", "把", "有", "也", "就", "都", "而", "之", "其", "这", "那", "一个"]
)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the sentences of ``text`` (whitespace-only ones dropped)."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        if m.group("line") and not _ends_line(text, m.start()):
            continue
        end = m.end()
        if end > start and text[start:end].strip():
            spans.append((start, end))
        start = end
    if start < len(text) and text[start:].strip():
        spans.append((start, len(text)))
    return spans


def _ends_line(text: str, at: int) -> bool:
    """Whether the single line break at ``at`` ends a sentence. Hard-wrapped text (PDF lines,
    HTML source, plain text files) goes on after a full line into a lower-case word; a
    heading, a short line, a line ending in ':' or a break before a capital, a list item or
    CJK text ends the sentence."""
    line = text[text.rfind("\n", 0, at) + 1:at].strip()
    after = text[at + 1:at + 2]
    wrapped = len(line) >= _SHORT_LINE and not line.endswith(":") and after.isalpha() and after.islower()
    return not wrapped


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, stripped."""
    return [text[a:b].strip() for a, b in sentence_spans(text)]


def query_terms(text: str) -> list[str]:
    """Lower-cased content words of a question or sentence (jieba for CJK runs)."""
    import jieba

    # jieba's logger is at DEBUG with its own stderr handler from its import on: its dictionary
    # loading ("Building prefix dict ...", twice over with Prefect's console) is no news to a user
    jieba.setLogLevel(logging.WARNING)
    terms: list[str] = []
    for token in jieba.lcut_for_search(text.lower()):
        token = token.strip()
        if not token or token in _STOP:
            continue
        if all(unicodedata.category(ch)[0] in "PZS" for ch in token):
            continue
        terms.append(token)
    return terms
