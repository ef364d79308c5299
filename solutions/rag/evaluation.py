"""Retrieval evaluation: QA sets (JSONL or SQuAD JSON) and recall@k / MRR@k."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infra.errors import DataValidationError

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
