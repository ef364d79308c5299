"""Glossary bench: retrieval with and without a collection's glossary; prints one JSON line and
writes a markdown table to bench/results/.

Sets (passages: the CMRC 2018 trial set's paragraphs, ingested once through our pipeline by
:func:`rag_retrieval_bench.run_set`):

- ``cmrc_syn``: CMRC questions rewritten to use a synonym or abbreviation that their gold
  paragraph does not contain (``bench/data/cmrc_glossary_qa.jsonl``, built by ``--build`` from
  the hand-written glossary ``bench/data/cmrc_glossary.yaml``: a question that names a form
  of a glossary entry found in its paragraph gets that form replaced by the entry's first
  other form absent from the paragraph — for a Latin form, none of its words may occur there).
- ``cmrc``: every CMRC trial question as asked (the glossary must not hurt them).
- ``en``: the English inverse-cloze set of :mod:`rag_retrieval_bench` over ``shared/data/docs``
  (``--sets`` adds it; its passages are ingested too).

For each set, the questions are retrieved as asked (``off``) and as the product expands them
with the glossary (``on``: :meth:`solutions.rag.glossary.Glossary.expand`, the same text for BM25
and the embedder; the hybrid weights are those of the questions as asked, as the product does);
recall@1/5/10 and MRR@10 of dense, BM25 and the product's hybrid (zscore fusion), scored as
:func:`rag_retrieval_bench.score_set` scores them.

Usage: python bench/rag_glossary_bench.py [--build] [--sets cmrc_syn,cmrc] [--model multilingual-e5-small]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import rag_retrieval_bench as rrb

GLOSSARY = ROOT / "bench" / "data" / "cmrc_glossary.yaml"
SYN_QA = ROOT / "bench" / "data" / "cmrc_glossary_qa.jsonl"
RETRIEVERS = ("dense", "bm25", "hybrid")
_CJK = re.compile(r"[\u3400-\u9fff]")


def absent(form: str, passage: str) -> bool:
    """Whether ``passage`` lacks ``form``: a CJK form as a substring; a Latin form as any of its
    words (BM25 would match a shared word)."""
    if _CJK.search(form):
        return form not in passage
    words = re.findall(r"[a-z0-9]+", form.lower())
    return not any(re.search(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", passage.lower()) for w in words)


def build_synonym_set(qa_path: Path, glossary_path: Path) -> list[dict]:
    """Questions whose first glossary form found in both the question and its paragraph is
    replaced by the entry's first other form absent from the paragraph (see the module doc)."""
    from solutions.rag.evaluation import load_qa
    from solutions.rag.glossary import load_glossary

    qa = load_qa(qa_path)
    glossary = load_glossary(glossary_path)
    text_of = {p.pid: p.text for p in qa.passages}
    out = []
    for item in qa.items:
        passage = text_of[item.gold_ids[0]]
        for match in glossary.matches(item.question):
            entry = next(e for e in glossary.entries if e.term == match.term)
            used = match.matched
            if used.lower() not in passage.lower():
                continue
            other = next((f for f in entry.forms if f != used and used not in f and f not in used
                          and absent(f, passage)), None)
            if other is None:
                continue
            question = re.sub(re.escape(used), lambda _m, o=other: o, item.question)
            out.append({"id": item.qid, "question": question, "original": item.question, "gold_ids": list(item.gold_ids),
                        "answers": list(item.answers), "term": entry.term, "replaced": [used, other]})
            break
    return out


def load_synonym_set(path: Path) -> list[tuple[str, str, str, None]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(r["id"], r["question"], r["gold_ids"][0], None) for r in rows]


def scores_of(raw: dict, by_location: bool) -> dict:
    """recall@1/5/10 and MRR@10 (whole set) of dense, BM25 and the product's hybrid."""
    scored = rrb.score_set(raw, by_location)["scores"]
    return {r: scored[r]["all"] for r in RETRIEVERS}


def render(results: dict, meta: dict) -> str:
    lines = ["# Retrieval with and without the collection's glossary", "",
             (f"Embedder `{meta['model']}`, glossary `{meta['glossary']}` ({meta['entries']} entries). "
             f"Command: `{meta['command']}`. Load average at the end: {meta['load_avg']} (2 shared cores, not quiet)."),
             "", "| set | questions | matched | retriever | recall@5 off | recall@5 on | MRR@10 off | MRR@10 on |",
             "|---|---|---|---|---|---|---|---|"]
    for name, res in results.items():
        for r in RETRIEVERS:
            off, on = res["off"][r], res["on"][r]
            lines.append(f"| {name} | {res['questions']} | {res['matched']} | {r} | {off['recall@5']:.3f} | "
                         f"{on['recall@5']:.3f} | {off['mrr@10']:.3f} | {on['mrr@10']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="multilingual-e5-small")
    parser.add_argument("--qa", default=str(rrb.DATA / "qa" / "cmrc2018_trial_squad.json"))
    parser.add_argument("--docs", default=str(rrb.DATA / "docs"))
    parser.add_argument("--glossary", default=str(GLOSSARY))
    parser.add_argument("--synonyms", default=str(SYN_QA))
    parser.add_argument("--sets", default="cmrc_syn,cmrc")
    parser.add_argument("--build", action="store_true", help="(re)write the synonym question set, then stop")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "rag_glossary.md"))
    args = parser.parse_args()
    if args.build:
        rows = build_synonym_set(Path(args.qa), Path(args.glossary))
        Path(args.synonyms).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(json.dumps({"built": str(args.synonyms), "questions": len(rows)}))
        return

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    home = Path(tempfile.mkdtemp(prefix="rag-glossary-bench-"))
    os.environ["INDUSFLOW_HOME"] = str(home)
    from infra.embeddings import embedder_from_settings
    from infra.milvus import open_client
    from solutions.rag.config import HybridWeights
    from solutions.rag.glossary import load_glossary
    from solutions.rag.weights import corpus_weights

    glossary = load_glossary(Path(args.glossary))
    passages, cmrc_questions = rrb.cmrc_set(Path(args.qa))
    sets: dict[str, tuple[list, list, bool]] = {}
    for name in args.sets.split(","):
        if name == "cmrc_syn":
            sets[name] = (passages, load_synonym_set(Path(args.synonyms)), False)
        elif name == "cmrc":
            sets[name] = (passages, cmrc_questions, False)
        elif name == "en":
            sets[name] = (*rrb.english_set(Path(args.docs), 300, 20, 0), True)
    started = time.perf_counter()
    client = open_client(uri=str(home / "bench.db"))
    embedder = embedder_from_settings(model=args.model)
    embedder.warm_up()
    results, ingested = {}, {}
    try:
        for name, (set_passages, questions, by_location) in sets.items():
            corpus = "en" if name == "en" else "cmrc"  # the CMRC sets share one collection, ingested once
            if corpus not in ingested:
                ingested[corpus] = rrb.run_set(corpus, set_passages, questions, embedder, client)
            base = ingested[corpus]
            texts = [q for _, q, _, _ in questions]
            expanded = [glossary.expand(q) for q in texts]
            weights = corpus_weights(embedder, texts, HybridWeights())  # of the questions as asked
            raw = {**base, "questions": questions, "hybrid_weights": weights,
                   **rrb.retrieved_lists(client, base["collection"], embedder, texts)}
            raw_on = {**raw, **rrb.retrieved_lists(client, base["collection"], embedder, [e.query for e in expanded])}
            results[name] = {"questions": len(questions), "matched": sum(1 for e in expanded if e.matches),
                             "off": scores_of(raw, by_location), "on": scores_of(raw_on, by_location)}
    finally:
        client.close()
    meta = {"model": args.model, "glossary": Path(args.glossary).name, "entries": len(glossary.entries),
            "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "load_avg": [round(x, 2) for x in os.getloadavg()], "seconds": round(time.perf_counter() - started, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(render(results, meta))
    print(json.dumps({"bench": "rag_glossary", **meta, "results": results}, separators=(",", ":"), ensure_ascii=False))


if __name__ == "__main__":
    main()
