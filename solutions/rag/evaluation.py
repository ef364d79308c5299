"""Retrieval evaluation: QA sets (JSONL or SQuAD JSON), the retrievers compared on them, and
recall@k / MRR@k."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.errors import DataValidationError
from infra.store import stable_hash
from solutions.rag.results import EvalResult, RetrieverScores

KS = (1, 5, 10)


@dataclass(frozen=True)
class QAItem:
    """One question with its gold: passage/document ids and/or answer strings."""

    qid: str
    question: str
    answers: tuple[str, ...] = ()
    gold_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class QAPassage:
    """A passage shipped with the QA set (SQuAD contexts), ingested before asking."""

    pid: str
    text: str
    title: str = ""


@dataclass
class QASet:
    """Questions plus the passages to ingest (empty for JSONL against an existing collection)."""

    name: str
    items: list[QAItem] = field(default_factory=list)
    passages: list[QAPassage] = field(default_factory=list)


def load_qa(path: Path) -> QASet:
    """Read SQuAD-format JSON (``data[].paragraphs[].qas[]``) or JSONL of
    ``{"question", "answers"?, "gold_ids"?}`` (``answer``/``doc_id``/``passage_id`` accepted)."""
    raw = path.read_text(encoding="utf-8")
    qa = QASet(name=path.stem)
    stripped = raw.lstrip()
    if stripped.startswith("{") and '"data"' in stripped[:2000] and "\n{" not in stripped[:2000]:
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DataValidationError(f"not valid JSON: {exc}", source=str(path)) from exc
        for article in doc.get("data", []):
            for i, para in enumerate(article.get("paragraphs", [])):
                pid = str(para.get("id") or f"{article.get('id', 'a')}-{i}")
                qa.passages.append(QAPassage(pid=pid, text=str(para["context"]), title=str(article.get("title", ""))))
                for q in para.get("qas", []):
                    answers = tuple(str(a["text"]) for a in q.get("answers", []) if a.get("text"))
                    qa.items.append(QAItem(qid=str(q.get("id", len(qa.items))), question=str(q["question"]),
                                           answers=answers, gold_ids=(pid,)))
        if not qa.items:
            raise DataValidationError("SQuAD file has no questions", source=str(path))
        return qa
    for line_no, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question = str(row["question"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DataValidationError(
                f"line {line_no} is not a JSON object with a 'question' ({exc})", source=str(path)
            ) from exc
        answers = row.get("answers", row.get("answer", []))
        answers = [answers] if isinstance(answers, str) else list(answers or [])
        answers = [a["text"] if isinstance(a, dict) else a for a in answers]
        gold = row.get("gold_ids", row.get("doc_id", row.get("passage_id", [])))
        gold = [gold] if isinstance(gold, str) else list(gold or [])
        if not answers and not gold:
            raise DataValidationError(f"line {line_no} has neither answers nor gold ids", source=str(path))
        qa.items.append(QAItem(qid=str(row.get("id", line_no)), question=question,
                               answers=tuple(map(str, answers)), gold_ids=tuple(map(str, gold))))
    if not qa.items:
        raise DataValidationError("no questions found", source=str(path))
    return qa


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk as the metric sees it."""

    source_id: str
    text: str


def first_relevant_rank(item: QAItem, hits: Sequence[Hit]) -> int | None:
    """1-based rank of the first relevant hit: its source id is gold, or (without gold ids) its
    text contains an answer."""
    for rank, hit in enumerate(hits, 1):
        if item.gold_ids:
            if hit.source_id in item.gold_ids:
                return rank
        elif any(a and a in hit.text for a in item.answers):
            return rank
    return None


def retrieval_metrics(ranks: Sequence[int | None], ks: Sequence[int] = KS, mrr_k: int = 10) -> dict[str, float]:
    """recall@k for each k and MRR@mrr_k from first-relevant ranks (None = not found)."""
    n = max(len(ranks), 1)
    out = {f"recall@{k}": sum(1 for r in ranks if r is not None and r <= k) / n for k in ks}
    out[f"mrr@{mrr_k}"] = sum(1.0 / r for r in ranks if r is not None and r <= mrr_k) / n
    return out


def render_eval_table(results: dict[str, dict[str, float]], title: str, notes: Sequence[str] = ()) -> str:
    """A markdown table: one row per retriever, one column per metric."""
    metrics = list(next(iter(results.values())).keys()) if results else []
    lines = [f"# {title}", "", "| retriever | " + " | ".join(metrics) + " |",
             "|---|" + "---|" * len(metrics)]
    for name, row in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[m]:.3f}" for m in metrics) + " |")
    lines.extend(["", *[f"- {n}" for n in notes]])
    return "\n".join(lines)


def qa_collection(qa: QASet) -> str:
    """The collection a QA set's own passages are ingested into (stable per set)."""
    return "eval_" + stable_hash({"qa": qa.name, "n": len(qa.passages)})[:12]


def retriever_configs(auto: dict[str, float]) -> dict[str, tuple[str, dict[str, float]]]:
    """The retrievers compared: ``name -> (mode, hybrid weights)``."""
    return {"dense": ("dense", {}), "bm25": ("bm25", {}), "hybrid": ("hybrid", auto)}


def dedupe_docs(chunks: Sequence[Mapping[str, Any]], k: int) -> list[Hit]:
    """The first ``k`` distinct documents among retrieved chunks (their stored fields), as hits;
    a QA set's own passages (``qa://set/pid``) are named by their passage id."""
    seen, out = set(), []
    for fields in chunks:
        path = fields.get("path", "")
        if path in seen:
            continue
        seen.add(path)
        out.append(Hit(source_id=path.rsplit("/", 1)[-1] if path.startswith("qa://") else path,
                       text=fields.get("text", "")))
        if len(out) == k:
            break
    return out


def retriever_scores(items: Sequence[QAItem], retrieved: Sequence[Sequence[Mapping[str, Any]]]) -> RetrieverScores:
    """recall@1/5/10 and MRR@10 of one retriever from the chunks it returned per question."""
    ranks = [first_relevant_rank(item, dedupe_docs(chunks, 10)) for item, chunks in zip(items, retrieved, strict=True)]
    m = retrieval_metrics(ranks)
    return RetrieverScores(recall_at_1=m["recall@1"], recall_at_5=m["recall@5"], recall_at_10=m["recall@10"],
                           mrr_at_10=m["mrr@10"])


def render_eval(r: EvalResult) -> str:
    """Markdown table of an evaluation."""
    rows = {name: {"recall@1": s.recall_at_1, "recall@5": s.recall_at_5, "recall@10": s.recall_at_10,
                   "MRR@10": s.mrr_at_10} for name, s in r.scores.items()}
    notes = [f"{r.questions} questions; collection {r.collection}; hybrid weights {r.hybrid_weights}",
             "hybrid = weighted standardised scores of dense and BM25"]
    if r.coverage:
        notes.append(f"embedder {r.coverage.model}: unknown pieces {r.coverage.unk_share:.1%}, passages over its "
                     f"window {r.coverage.truncated_share:.1%}")
    return render_eval_table(rows, f"rag-eval: {Path(r.qa_file).name}", notes)


# ------------------------------------------------------------------------------------
# OCR quality


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        cur = [i]
        for j, cb in enumerate(b, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def cer(reference: str, hypothesis: str, *, keep_spaces: bool = True) -> float:
    """Character error rate of an OCR text: edit distance / reference length, after whitespace
    is normalised to single spaces (``keep_spaces``) or removed (Chinese, which has none)."""
    norm = (lambda s: " ".join(s.split())) if keep_spaces else (lambda s: "".join(s.split()))
    ref, hyp = norm(reference), norm(hypothesis)
    return edit_distance(ref, hyp) / max(len(ref), 1)


def _without_spaces(text: str) -> tuple[str, set[int]]:
    """``text`` without whitespace, and the indexes (in that string) of the characters that
    followed whitespace."""
    chars, after_space = [], set()
    for c in text:
        if c.isspace():
            after_space.add(len(chars))
        else:
            chars.append(c)
    return "".join(chars), after_space


def lost_word_boundaries(reference: str, hypothesis: str) -> tuple[int, int]:
    """How many of the reference's word boundaries an OCR text ran together: ``(lost, seen)``.

    A boundary is seen where the hypothesis read both characters around it, one after the
    other (the texts are aligned without their whitespace); it is lost when the hypothesis has
    no whitespace between them ("Clause7"). Boundaries next to misread characters are left
    out, so the share measures spacing alone, apart from the character errors CER counts.
    """
    from difflib import SequenceMatcher

    ref, ref_spaces = _without_spaces(reference)
    hyp, hyp_spaces = _without_spaces(hypothesis)
    to_hyp: dict[int, int] = {}
    for block in SequenceMatcher(None, ref, hyp, autojunk=False).get_matching_blocks():
        to_hyp.update({block.a + k: block.b + k for k in range(block.size)})
    seen = lost = 0
    for i in ref_spaces:
        if 0 < i < len(ref) and i in to_hyp and to_hyp.get(i - 1) == to_hyp[i] - 1:
            seen += 1
            lost += to_hyp[i] not in hyp_spaces
    return lost, seen
