"""Answers with citations, QA loading, retrieval metrics, fusion and filters (no engines)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from infra.errors import DataValidationError
from solutions.rag.answer import Passage, build_messages, cited_numbers, extractive_answer, is_heading
from solutions.rag.evaluation import Hit, QAItem, first_relevant_rank, load_qa, retrieval_metrics
from solutions.rag.weights import dense_weight_for, query_weights
from tasks.containers import ArchiveLimits, Budget, expand_zip
from tasks.documents import guess_language, normalise_text
from tasks.retrieve import Retrieved, build_filter, fuse


def _p(n: int, text: str) -> Passage:
    return Passage(number=n, text=text, doc_id=f"d{n}", path=f"/docs/{n}.txt", chunk_index=0)


def test_extractive_answer_cites_best_sentences() -> None:
    passages = [_p(1, "Milvus stores vectors. It was released in 2019."),
                _p(2, "北京是中国的首都。上海是最大的城市。")]
    answer = extractive_answer("中国的首都是哪里？", passages, max_sentences=1)
    assert answer == "北京是中国的首都。 [2]"
    answer = extractive_answer("When was it released?", passages, max_sentences=1)
    assert answer.endswith("[1]") and "2019" in answer
    assert cited_numbers("see [2] and [1][2] and [9]", 3) == [2, 1]
    system, user = build_messages("q?", passages)
    assert "[1]" in user[1] and "[2]" in user[1] and system[0] == "system"


def test_extractive_answer_does_not_quote_a_title_as_a_sentence() -> None:
    """Seen on the page: "# Centrifugal pump P-200: maintenance [1]" and "LEASE AGREEMENT - SCANNED
    COPY [1]" led every answer. Headings are quoted only when no statement matches."""
    manual = Passage(1, "# Centrifugal pump P-200: maintenance\n\nThe mechanical seal of the pump is replaced "
                        "every 4,000 operating hours. Bearings are greased monthly.", "d1", "pump.md", 0,
                     title="Centrifugal pump P-200: maintenance")
    answer = extractive_answer("How often is the pump seal replaced?", [manual])
    assert answer.startswith("The mechanical seal of the pump is replaced every 4,000 operating hours. [1]")
    assert "# Centrifugal" not in answer
    lease = Passage(1, "LEASE AGREEMENT - SCANNED COPY\nClause 7. The tenant shall give three months notice "
                       "of termination.", "d2", "lease.pdf", 0, page=1)
    answer = extractive_answer("What notice does the lease agreement require?", [lease])
    assert "LEASE AGREEMENT" not in answer and "three months notice" in answer
    only_title = Passage(1, "Pump maintenance", "d3", "t.txt", 0)
    assert extractive_answer("pump maintenance?", [only_title]) == "Pump maintenance [1]"  # nothing else to quote
    assert is_heading("MAINTENANCE SCHEDULE") and is_heading("Maintenance schedule") and is_heading("## Seals")
    assert not is_heading("Seal replacement: every 4,000 h") and not is_heading("The seal is replaced yearly.")
    assert not is_heading("密封件每运行4000小时更换一次") and is_heading("维护手册")


def test_load_squad_and_jsonl(tmp_path: Path) -> None:
    squad = {"version": "v", "data": [{"id": "a", "title": "T", "paragraphs": [
        {"id": "p1", "context": "ctx one", "qas": [{"id": "q1", "question": "Q?", "answers": [{"text": "one"}]}]}]}]}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(squad))
    qa = load_qa(f)
    assert qa.items[0].gold_ids == ("p1",) and qa.passages[0].text == "ctx one"
    j = tmp_path / "q.jsonl"
    j.write_text('{"question": "A?", "answers": ["x"]}\n\n{"question": "B?", "doc_id": "/d/b.pdf"}\n')
    qa = load_qa(j)
    assert [i.answers for i in qa.items] == [("x",), ()] and qa.items[1].gold_ids == ("/d/b.pdf",)
    j.write_text('{"question": "A?"}\n')
    with pytest.raises(DataValidationError, match="neither answers nor gold"):
        load_qa(j)


def test_metrics() -> None:
    item = QAItem("1", "q", answers=("needle",))
    assert first_relevant_rank(item, [Hit("a", "hay"), Hit("b", "a needle")]) == 2
    m = retrieval_metrics([1, 2, None, 7])
    assert m["recall@1"] == 0.25 and m["recall@5"] == 0.5 and m["recall@10"] == 0.75
    assert m["mrr@10"] == pytest.approx((1 + 0.5 + 1 / 7) / 4)


def test_weighted_fusion_keeps_a_weak_retriever_from_dragging() -> None:
    bm25 = [Retrieved(i, s, {}) for i, s in (("good", 9.0), ("b2", 8.0), ("b3", 7.0), ("b4", 6.0))]
    dense = [Retrieved(i, s, {}) for i, s in (("junk1", 0.9), ("junk2", 0.88), ("good", 0.8))]
    equal = fuse({"dense": dense, "bm25": bm25}, {"dense": 1.0, "bm25": 1.0}, 3)
    assert [r.id for r in equal] == ["good", "junk1", "junk2"]  # at equal weight dense's junk pushes b2, b3 out
    low = fuse({"dense": dense, "bm25": bm25}, {"dense": 0.05, "bm25": 1.0}, 3)
    assert [r.id for r in low] == ["good", "b2", "b3"]  # BM25's order survives
    assert low[0].ranks == {"dense": 3, "bm25": 1} and low[0].scores == {"dense": 0.8, "bm25": 9.0}
    assert dense_weight_for(0.0) == 1.0 and dense_weight_for(0.58) == 0.1 and 0.1 < dense_weight_for(0.1) < 1


def test_filters_quote_user_values() -> None:
    expr = build_filter(content_type="application/pdf", path_prefix='/x" or id != "', language="zh",
                        created_from="2020-01-01", created_to="2020-12-31")
    assert 'path like "/x\\" or id != \\"%"' in expr
    assert "created_ts >= 1577836800" in expr and "created_ts <= 1609459199" in expr
    assert build_filter() == ""


def test_text_normalisation_and_language() -> None:
    assert normalise_text("a\x00b\ud800c\r\n\n\n\nd  \n") == "a bc\n\nd"
    assert guess_language("这是中文文本，包含很多汉字。" * 3) == "zh"
    assert guess_language("plain English text") == "en"


def test_zip_members_in_memory() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a.txt", "hello")
        zf.writestr("dir/", "")
    limits = ArchiveLimits(max_members=10, max_member_bytes=1000)
    members = expand_zip(buf.getvalue(), limits, Budget(1000)).members
    assert [(m.name, m.data, m.reason) for m in members] == [("a.txt", b"hello", "")]
    assert expand_zip(b"PK\x03\x04broken", limits, Budget(1000)).failure[0] == "corrupt"


def test_fusion_keeps_bm25_confidence() -> None:
    bm25 = [Retrieved("good", 20.0, {}), Retrieved("b2", 5.0, {}), Retrieved("b3", 4.9, {})]
    dense = [Retrieved("b3", 0.9, {}), Retrieved("junk", 0.8, {}), Retrieved("good", 0.1, {})]
    order = [r.id for r in fuse({"dense": dense, "bm25": bm25}, {"dense": 0.1, "bm25": 1.0}, 4)]
    assert order[0] == "good"  # a confident BM25 hit stays first, though dense ranks it last
    assert order.index("b3") < order.index("b2")  # dense breaks BM25's near tie


def test_auto_fusion_weight_trusts_only_the_model_own_tokenizer(tmp_path) -> None:
    """A remote model counted with a stand-in tokenizer gets no coverage-based down-weighting."""
    from infra.embeddings import OpenAIEmbedder
    from infra.settings import EmbeddingSettings
    from solutions.rag.config import HybridWeights

    class _Tok:
        unk_token_id = 0

        def __call__(self, text, **_):
            return {"input_ids": [0 if ord(ch) > 127 else 5 for ch in text if not ch.isspace()]}

    stand_in = OpenAIEmbedder(EmbeddingSettings(url="http://127.0.0.1:9/v1", model="remote-m"))
    stand_in._tokenizer = _Tok()
    assert stand_in.exact_tokenizer is False
    assert query_weights(stand_in, "轴承故障的特征是什么", HybridWeights())["dense"] == 1.0
    own = OpenAIEmbedder(EmbeddingSettings(url="http://127.0.0.1:9/v1", model="remote-m", tokenizer=tmp_path))
    own._tokenizer = _Tok()
    assert own.exact_tokenizer is True
    assert query_weights(own, "轴承故障的特征是什么", HybridWeights())["dense"] == 0.1
    assert query_weights(own, "bearing fault", HybridWeights())["dense"] == 1.0
