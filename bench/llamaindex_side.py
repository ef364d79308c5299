"""The LlamaIndex side of ``bench/rag_vs_llamaindex.py``: run with the bench's own virtualenv
(``bench/.venv-llamaindex``), never with the project's. Prints one JSON line.

Ingest: the passages as ``Document``s (in memory, their id kept out of the embedded text) -> SentenceSplitter (the embedder's own word pieces,
as indusflow counts them) -> HuggingFaceEmbedding (the same local MiniLM folder) -> MilvusVectorStore
(Milvus Lite file). Query: one ``retriever.retrieve`` per question, top-k chunks -> their files.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", required=True, help="JSON list of [passage id, text]")
    parser.add_argument("--questions", required=True, help="JSON list of [question, gold passage id]")
    parser.add_argument("--db", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--overlap", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.milvus import MilvusVectorStore
    from transformers import AutoTokenizer

    out: dict = {"side": "llamaindex", "threads": torch.get_num_threads()}
    t = time.perf_counter()
    embed = HuggingFaceEmbedding(model_name=args.model, device="cpu", embed_batch_size=args.batch)
    tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    tok.model_max_length = 10**9
    out["model_load_s"] = round(time.perf_counter() - t, 2)

    def pieces(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    t = time.perf_counter()
    documents = [Document(text=text, metadata={"pid": pid}, excluded_embed_metadata_keys=["pid"],
                          excluded_llm_metadata_keys=["pid"])
                 for pid, text in json.loads(Path(args.passages).read_text())]
    splitter = SentenceSplitter(chunk_size=args.chunk, chunk_overlap=args.overlap, tokenizer=pieces)
    store = MilvusVectorStore(uri=args.db, dim=embed._model.get_sentence_embedding_dimension()
                              if hasattr(embed, "_model") else 384, overwrite=True)
    index = VectorStoreIndex.from_documents(documents, storage_context=StorageContext.from_defaults(vector_store=store),
                                            embed_model=embed, transformations=[splitter])
    out["ingest_s"] = round(time.perf_counter() - t, 2)
    out["documents"] = len(documents)

    questions = json.loads(Path(args.questions).read_text())
    retriever = index.as_retriever(similarity_top_k=args.top_k, embed_model=embed)
    hit_ids: list[int] = []
    t = time.perf_counter()
    for i, (question, gold) in enumerate(questions):
        nodes = retriever.retrieve(question)
        if gold in [n.node.metadata.get("pid") for n in nodes]:
            hit_ids.append(i)
    out["query_s"] = round(time.perf_counter() - t, 2)
    out["questions"] = len(questions)
    out["recall_at_k"] = round(len(hit_ids) / max(len(questions), 1), 4)
    out["hit_ids"] = hit_ids  # the questions whose gold passage was retrieved (for a paired comparison)
    out["chunks"] = int(store.client.query(store.collection_name, filter="", output_fields=["count(*)"])[0]["count(*)"])
    out["total_s"] = round(out["ingest_s"] + out["query_s"], 2)
    import llama_index.core

    out["version"] = llama_index.core.__version__
    print(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main()
