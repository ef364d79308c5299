"""Abstention bench: does the knowledge base answer only what its documents answer?

Prints one JSON line of figures and writes a markdown table to bench/results/. With ``--write``
it also writes the fitted support models to ``solutions/rag/abstain_calibration.json`` (the
packaged calibration the product reads; its ``source`` and ``figures`` record this run).

Sets (every passage goes through the product's ingest rules into a Milvus Lite collection, and
every question through the product's hybrid retrieval, top 5):
- ``cmrc-A`` (calibration): half of the CMRC 2018 trial passages (seeded shuffle) ingested.
  Answerable: the questions of those passages. Unanswerable, same domain: the questions of the
  other half (Chinese Wikipedia-style questions whose passage is not in the collection).
  Unanswerable, out of domain: the even lines of ``bench/data/kb_out_of_domain.jsonl`` (our own
  medical, legal, banking and plant questions, English and Chinese).
- ``cmrc-B`` (transfer, same kind): the other half ingested, the roles of the questions swapped,
  the odd out-of-domain lines. The models fitted on ``cmrc-A`` are applied unchanged.
- ``en-docs`` (transfer, another language and corpus): the English documents of
  ``shared/data/docs`` (parsed by our pipeline), split in two halves of documents; half A is
  ingested. Answerable: a sentence that occurs in one document of half A only, with a third of
  its words dropped (a keyword query whose words are in one passage). Unanswerable, same domain:
  the same from half B's documents. Out of domain: the odd out-of-domain lines. Weakness: the
  queries are the documents' own sentences, easier for lexical signals than a user's question.

Support models (``MODEL_FEATURES``): one on every signal, one on the dense and term signals
only (used for dense-only retrieval; fitted on the same hybrid retrievals' signals), ``lexical``
(no dense signal) and ``terms``; each is reported on every set.

Figures per set: abstention on unanswerable (same domain, out of domain), false abstention on
answerable, and "gold cited": of the answerable questions answered, the share whose extractive
answer cites the gold passage. Targets (issue 27): >= 90 % abstention, <= 5 % false abstention,
gold cited >= 95 %. The threshold is chosen on ``cmrc-A`` only, as the 4th percentile of the
answerable questions' support probability (so about 4 % false abstention there).

Usage: python bench/kb_abstain_bench.py [--write] [--limit N] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DATA = ROOT.parent / "shared" / "data"
OOD_FILE = Path(__file__).resolve().parent / "data" / "kb_out_of_domain.jsonl"
TOP_K = 5
#: the signals of each support model (solutions/rag/support.py): every one; dense-only retrieval;
#: no dense signal (another embedder, BM25 only); terms only
MODEL_FEATURES = {"embedder": ("dense_top", "coverage", "sentence_coverage", "bm25_norm", "agree", "top_agree"),
                  "dense": ("dense_top", "coverage", "sentence_coverage"),
                  "lexical": ("coverage", "sentence_coverage", "bm25_norm"),
                  "terms": ("coverage", "sentence_coverage")}
FALSE_ABSTENTION_QUANTILE = 0.04


def ingest(name: str, passages: list[tuple[str, str, str]], embedder: Any, client: Any) -> str:
    """``passages`` ``(id, title, text)`` in a new collection under the product's default rules."""
    from solutions.rag.config import ChunkParams, RedactionParams
    from solutions.rag.ingest import document_rules
    from tasks.chunk import embedder_window
    from tasks.ingest import ingest_texts, text_documents

    rules = document_rules(ChunkParams(), RedactionParams(), embedder.name, embedder_window(embedder))
    collection = re.sub(r"[^a-z0-9_]", "_", name.lower())
    ingest_texts(text_documents(passages, f"qa://{collection}"), rules, collection=collection, client=client,
                 embedder=embedder)
    client.load_collection(collection)
    return collection


def retrieve_all(client: Any, collection: str, embedder: Any, questions: list[str]) -> list[list[Any]]:
    """The product's hybrid top-``TOP_K`` for each question (redacted first, as the product does)."""
    from infra.embeddings import encode_queries
    from infra.pii import redact_text
    from solutions.rag.config import HybridWeights
    from solutions.rag.weights import query_weights
    from tasks.retrieve import retrieve

    hybrid = HybridWeights()
    questions = [redact_text(q) for q in questions]
    vectors = encode_queries(embedder, questions, batch_size=64)
    out = []
    for q, v in zip(questions, vectors, strict=True):
        out += retrieve(client, collection, [q], v[None, :], mode="hybrid", top_k=TOP_K,
                        weights=query_weights(embedder, q, hybrid))
    return out


def records_for(kind: str, questions: list[str], golds: list[str | None], hits: list[list[Any]],
                client: Any, collection: str) -> list[dict]:
    """One record per question: its kind, signals and whether its extractive answer cites the gold."""
    from infra.milvus import row_count
    from infra.pii import redact_text
    from solutions.rag.answer import cited_numbers, extractive_answer, passages_from
    from solutions.rag.support import content_query, support_signals
    from tasks.retrieve import best_bm25

    n_chunks = row_count(client, collection)
    out = []
    for question, gold, h in zip(questions, golds, hits, strict=True):
        q = redact_text(question)  # as the product does before retrieval and answers
        passages = passages_from(h)
        cited = cited_numbers(extractive_answer(q, passages), len(passages)) if passages else []
        gold_cited = gold is not None and any(h[n - 1].fields.get("path", "").endswith("/" + gold) for n in cited)
        probe = best_bm25(client, collection, content_query(q))
        out.append({"kind": kind, "signals": support_signals(q, h, n_chunks, "hybrid", probe).as_dict(),
                    "gold_cited": gold_cited,
                    "gold_retrieved": gold is not None and any(x.fields.get("path", "").endswith("/" + gold) for x in h)})
    return out


def features(records: list[dict], names: list[str]) -> Any:
    import numpy as np

    return np.asarray([[r["signals"][n] for n in names] for r in records], dtype=float)


def fit(records: list[dict], names: list[str]) -> Any:
    """A logistic support model on ``names`` and its threshold (see the module docstring)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from solutions.rag.support import SupportModel

    y = np.asarray([r["kind"] == "answerable" for r in records], dtype=int)
    lr = LogisticRegression(C=1.0, class_weight="balanced", max_iter=1000).fit(features(records, names), y)
    model = SupportModel(features=names, coef=[round(float(c), 6) for c in lr.coef_[0]],
                         intercept=round(float(lr.intercept_[0]), 6), threshold=0.5)
    p = probabilities(records, model)
    threshold = float(np.quantile([pi for pi, r in zip(p, records, strict=True) if r["kind"] == "answerable"],
                                  FALSE_ABSTENTION_QUANTILE))
    return model.model_copy(update={"threshold": round(threshold, 6)})


def probabilities(records: list[dict], model: Any) -> list[float]:
    from solutions.rag.support import Signals

    return [model.probability(Signals(**r["signals"])) for r in records]


def figures(records: list[dict], model: Any) -> dict[str, Any]:
    """Abstention, false abstention and gold cited of ``model`` on ``records``."""
    p = probabilities(records, model)
    answered = [pi >= model.threshold for pi in p]

    def share(kind: str, want: bool) -> float | None:
        sel = [a for a, r in zip(answered, records, strict=True) if r["kind"] == kind]
        return round(sum(a == want for a in sel) / len(sel), 4) if sel else None

    ans = [r for a, r in zip(answered, records, strict=True) if a and r["kind"] == "answerable"]
    counts = {k: sum(r["kind"] == k for r in records) for k in ("answerable", "same_domain", "out_of_domain")}
    unans = [a for a, r in zip(answered, records, strict=True) if r["kind"] != "answerable"]
    return {"questions": counts,
            "abstention_unanswerable": round(sum(not a for a in unans) / max(len(unans), 1), 4),
            "abstention_same_domain": share("same_domain", False),
            "abstention_out_of_domain": share("out_of_domain", False),
            "false_abstention": share("answerable", False),
            "gold_cited": round(sum(r["gold_cited"] for r in ans) / max(len(ans), 1), 4),
            "gold_retrieved_answerable": round(sum(r["gold_retrieved"] for r in records if r["kind"] == "answerable")
                                               / max(counts["answerable"], 1), 4)}


def cmrc_halves(path: Path, seed: int, limit: int) -> tuple[list, list, dict[str, list[tuple[str, str]]]]:
    from solutions.rag.evaluation import load_qa

    qa = load_qa(path)
    passages = [(p.pid, p.title, p.text) for p in qa.passages]
    random.Random(seed).shuffle(passages)
    if limit:
        passages = passages[:limit]
    half = len(passages) // 2
    by_pid: dict[str, list[tuple[str, str]]] = {}
    for it in qa.items:
        by_pid.setdefault(it.gold_ids[0], []).append((it.question, it.gold_ids[0]))
    return passages[:half], passages[half:], by_pid


def english_halves(docs_dir: Path, seed: int, per_doc: int, max_chars: int = 20_000) -> tuple[list, list, list]:
    """``(passages of half A, answerable [(query, doc)], same-domain [(query, None)])``."""
    from rag_retrieval_bench import sentences

    from tasks.documents import discover, parse_sources

    parsed = parse_sources(discover([docs_dir])).documents
    docs = [d for d in parsed if d.meta.language == "en" and len(d.text) >= 400]
    norm = lambda s: re.sub(r"\W+", " ", s.lower()).strip()
    counts: dict[str, int] = {}
    for d in docs:
        for a, b in sentences(d.text[:max_chars]):
            counts[norm(d.text[a:b])] = counts.get(norm(d.text[a:b]), 0) + 1
    rng = random.Random(seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    half_a = set(order[: len(order) // 2])
    passages, answerable, same = [], [], []
    for i, d in enumerate(docs):
        text = d.text[:max_chars]
        if i in half_a:
            passages.append((f"doc{i}", d.meta.title or f"doc{i}", text))
        picks = []
        for a, b in sentences(text):
            words = text[a:b].split()
            alpha = sum(1 for w in words if re.fullmatch(r"[A-Za-z][A-Za-z'\-]*[.,;:!?]?", w))
            if "\ufffd" not in text[a:b] and 8 <= len(words) <= 40 and alpha >= 0.8 * len(words) \
                    and counts.get(norm(text[a:b])) == 1:
                picks.append(words)
        rng.shuffle(picks)
        for words in picks[:per_doc]:
            keep = sorted(rng.sample(range(len(words)), k=max(4, (2 * len(words)) // 3)))
            query = " ".join(words[k] for k in keep)
            (answerable if i in half_a else same).append((query, f"doc{i}" if i in half_a else None))
    return passages, answerable, same


def table(results: dict[str, dict]) -> str:
    lines = [("| set | model | n answerable | n same-domain | n out-of-domain | abstention (unanswerable) "
              "| abstention same-domain | abstention out-of-domain | false abstention | gold cited | gold retrieved |"),
             "|---" * 11 + "|"]
    for set_name, per_model in results.items():
        for model, f in per_model.items():
            q = f["questions"]
            lines.append(f"| {set_name} | {model} | {q['answerable']} | {q['same_domain']} | {q['out_of_domain']} | "
                         f"{f['abstention_unanswerable']:.3f} | {f['abstention_same_domain']} | "
                         f"{f['abstention_out_of_domain']} | {f['false_abstention']} | {f['gold_cited']:.3f} | "
                         f"{f['gold_retrieved_answerable']:.3f} |")
    return "\n".join(lines)


def collect(args: argparse.Namespace, embedder: Any, home: Path, started: float) -> dict[str, list[dict]]:
    """Ingest every set and retrieve every question: the records per set (see the docstring)."""
    from infra.milvus import open_client

    client = open_client(uri=str(home / "bench.db"))
    ood = [json.loads(line)["question"] for line in OOD_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    half_a, half_b, by_pid = cmrc_halves(Path(args.qa), args.seed, args.limit)
    records: dict[str, list[dict]] = {}
    for name, ingested, other, ood_part in (("cmrc-A", half_a, half_b, ood[0::2]), ("cmrc-B", half_b, half_a, ood[1::2])):
        collection = ingest(name, ingested, embedder, client)
        ans = [qg for pid, _, _ in ingested for qg in by_pid.get(pid, [])]
        same = [(q, None) for pid, _, _ in other for q, _ in by_pid.get(pid, [])]
        recs = []
        for kind, items in (("answerable", ans), ("same_domain", same), ("out_of_domain", [(q, None) for q in ood_part])):
            qs = [q for q, _ in items]
            recs += records_for(kind, qs, [g for _, g in items], retrieve_all(client, collection, embedder, qs),
                                client, collection)
        records[name] = recs
        print(f"{name}: {len(recs)} questions ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    if not args.no_english:
        passages, ans, same = english_halves(Path(args.docs), args.seed, args.per_doc)
        collection = ingest("en-docs", passages, embedder, client)
        recs = []
        for kind, items in (("answerable", ans), ("same_domain", same), ("out_of_domain", [(q, None) for q in ood[1::2]])):
            qs = [q for q, _ in items]
            recs += records_for(kind, qs, [g for _, g in items], retrieve_all(client, collection, embedder, qs),
                                client, collection)
        records["en-docs"] = recs
        print(f"en-docs: {len(recs)} questions ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    client.close()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qa", default=str(DATA / "qa" / "cmrc2018_trial_squad.json"))
    parser.add_argument("--docs", default=str(DATA / "docs"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="the first N CMRC passages only (a smoke run)")
    parser.add_argument("--per-doc", type=int, default=10, help="English queries per document")
    parser.add_argument("--no-english", action="store_true", help="skip the en-docs transfer set")
    parser.add_argument("--write", action="store_true", help="write solutions/rag/abstain_calibration.json")
    parser.add_argument("--save-records", default="", help="write every question's signals here (JSON)")
    parser.add_argument("--from-records", default="", help="fit and score saved signals instead of retrieving")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "kb_abstain.md"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    home = Path(tempfile.mkdtemp(prefix="kb-abstain-bench-"))
    os.environ["INDUSFLOW_HOME"] = str(home)
    from infra.embeddings import embedder_from_settings
    from solutions.rag.support import DENSE_SUFFIX, LEXICAL, TERMS, Calibration, write_calibration

    started = time.perf_counter()
    embedder = embedder_from_settings()
    if args.from_records:
        records = json.loads(Path(args.from_records).read_text(encoding="utf-8"))
    else:
        records = collect(args, embedder, home, started)
    if args.save_records:
        Path(args.save_records).write_text(json.dumps(records), encoding="utf-8")

    models = {embedder.name: fit(records["cmrc-A"], list(MODEL_FEATURES["embedder"])),
              embedder.name + DENSE_SUFFIX: fit(records["cmrc-A"], list(MODEL_FEATURES["dense"])),
              LEXICAL: fit(records["cmrc-A"], list(MODEL_FEATURES["lexical"])),
              TERMS: fit(records["cmrc-A"], list(MODEL_FEATURES["terms"]))}
    results = {s: {m: figures(recs, model) for m, model in models.items()} for s, recs in records.items()}
    load = [round(x, 2) for x in os.getloadavg()]
    line = {"bench": "kb_abstain", "embedder": embedder.name, "seed": args.seed, "top_k": TOP_K,
            "models": {m: model.model_dump() for m, model in models.items()}, "results": results, "loadavg": load,
            "seconds": round(time.perf_counter() - started, 1)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Abstention: answers only what the documents answer\n\n"
                   f"`python bench/kb_abstain_bench.py` (seed {args.seed}, top {TOP_K}, embedder {embedder.name}); "
                   f"models fitted and thresholds chosen on cmrc-A only; load average {load}.\n\n"
                   + table(results) + "\n\nModels:\n\n```json\n"
                   + json.dumps(line["models"], indent=1) + "\n```\n", encoding="utf-8")
    if args.write:
        write_calibration(Calibration(
            source=(f"python bench/kb_abstain_bench.py --write (seed {args.seed}): fitted on cmrc-A, half of the CMRC "
                    "2018 trial passages ingested; answerable = their questions, unanswerable = the other half's "
                    "questions and bench/data/kb_out_of_domain.jsonl's even lines"),
            figures={s: {m: {k: v for k, v in f.items() if k != "questions"} for m, f in per.items()}
                     for s, per in results.items()},
            models=models))
    print(json.dumps(line, ensure_ascii=False))


if __name__ == "__main__":
    main()
