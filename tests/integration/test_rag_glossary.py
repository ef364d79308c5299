"""A collection's glossary on the embedded engines (Milvus Lite, the packaged embedder): a
question that names a term by a synonym or abbreviation its passage does not use finds that
passage only with the glossary, and the answer says which entry matched."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.rag.steps import answer_question, ingest_sources
from solutions.rag.config import AskParams, ChunkParams, IngestParams
from solutions.rag.glossary import save_glossary

COLLECTION = "it_glossary"
DOCS = {
    "infarct.txt": "急性心肌梗死是冠状动脉急性、持续性缺血缺氧所引起的心肌坏死。患者多有剧烈而持久的胸骨后疼痛，"
                   "休息和含服硝酸甘油不能完全缓解。",
    "flu.txt": "流行性感冒的典型症状包括高热、头痛、乏力和全身肌肉酸痛，症状通常在一周内缓解。",
    "confidentiality.txt": "A non-disclosure agreement obliges the receiving party to keep the disclosed "
                           "information secret for five years after the agreement ends.",
    "lease.txt": "The lease runs for twelve months; the tenant must keep the premises in good repair and "
                 "pay the rent on the first working day of each month.",
}
GLOSSARY = """\
terms:
  - term: 心肌梗死
    synonyms: [心肌梗塞]
    abbreviations: [心梗, AMI]
  - term: non-disclosure agreement
    synonyms: [confidentiality agreement]
    abbreviations: [NDA]
"""


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory, milvus, embedder) -> str:
    folder = tmp_path_factory.mktemp("glossary-docs")
    for name, text in DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    params = IngestParams(collection=COLLECTION, chunk=ChunkParams(tokens=128, overlap=32))
    assert ingest_sources([str(folder)], params, client=milvus, embedder=embedder).chunked_documents == len(DOCS)
    return COLLECTION


@pytest.mark.parametrize(("question", "gold", "term", "matched"), [
    ("心梗的典型症状是什么？", "infarct.txt", "心肌梗死", "心梗"),
    ("For how many months does an NDA bind?", "confidentiality.txt", "non-disclosure agreement", "NDA"),
])
@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_a_synonym_question_finds_its_passage_only_with_the_glossary(kb: str, milvus, embedder, mode: str,
                                                                     question: str, gold: str, term: str,
                                                                     matched: str) -> None:
    save_glossary(kb, GLOSSARY, "yaml")  # <home>/rag/glossary/it_glossary.yaml
    without = answer_question(question, AskParams(collection=kb, mode=mode, llm=False, glossary=False),
                              client=milvus, embedder=embedder)
    assert not without.hits or Path(without.hits[0].path).name != gold
    assert without.glossary == []
    with_glossary = answer_question(question, AskParams(collection=kb, mode=mode, llm=False),
                                    client=milvus, embedder=embedder)
    assert Path(with_glossary.hits[0].path).name == gold
    assert [(m.term, m.matched) for m in with_glossary.glossary] == [(term, matched)]
    assert with_glossary.question == question  # the result shows the question as asked
    if gold == "infarct.txt":  # the answer step reads 心梗 as the passage's 心肌梗死
        assert with_glossary.answered, with_glossary.support
        assert Path(with_glossary.citations[0].path).name == gold and "心肌梗死" in with_glossary.answer


def test_a_question_without_a_glossary_term_is_unchanged(kb: str, milvus, embedder) -> None:
    save_glossary(kb, GLOSSARY, "yaml")
    params = AskParams(collection=kb, mode="bm25", llm=False)
    res = answer_question("流行性感冒有哪些症状？", params, client=milvus, embedder=embedder)
    assert res.glossary == [] and Path(res.hits[0].path).name == "flu.txt"
    off = answer_question("流行性感冒有哪些症状？", params.model_copy(update={"glossary": False}), client=milvus,
                          embedder=embedder)
    assert [h.path for h in off.hits] == [h.path for h in res.hits]
