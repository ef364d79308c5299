"""Containers against the real engines: every inner document is its own document, with its own id,
hash, content type and quarantine entry; re-ingest stays idempotent, changes replace, prune removes."""

from __future__ import annotations

import io
import mailbox
import sys
import tarfile
import zipfile
from email.message import EmailMessage
from pathlib import Path

import pytest

pytest.importorskip("iscc_tika")

from flows.rag.steps import ingest_sources
from infra.milvus import query_all
from solutions.rag.config import ChunkParams, IngestParams
from tasks.documents import discover, doc_id_for, parse_sources

sys.path.insert(0, str(Path(__file__).parent))
from _hash_embedder import HashEmbedder

SMALL = ChunkParams(tokens=64, overlap=16)


def _text(topic: str) -> bytes:
    return " ".join(f"This note is about {topic}, sentence {j}." for j in range(12)).encode()


def _zip_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


def _mbox(path: Path, subjects: list[str]) -> None:
    box = mailbox.mbox(path)
    for subject in subjects:
        msg = EmailMessage()
        msg["Subject"], msg["From"], msg["To"] = subject, "sender@example.com", "team@example.com"
        msg.set_content(_text(subject).decode())
        msg.add_attachment(_text(f"{subject} attachment"), maintype="text", subtype="plain",
                           filename=f"{subject.split()[0].lower()}.txt")
        box.add(msg)
    box.flush()
    box.close()


def _rel(path: str, root: Path) -> str:
    return path.replace(str(root) + "/", "")


def test_each_archive_kind_yields_inner_documents(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "bundle.zip").write_bytes(_zip_bytes([("a.txt", _text("alpha")), ("sub/b.txt", _text("beta")),
                                                  ("empty.txt", b""), ("../escape.txt", _text("escape"))]))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in [("t/one.txt", _text("tar one")), ("t/inner.zip", _zip_bytes([("deep.txt", _text("deep"))]))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (root / "pack.tgz").write_bytes(buf.getvalue())
    _mbox(root / "mail.mbox", ["Budget planning", "Hiring news"])
    nested = _zip_bytes([("l4.txt", _text("level four"))])
    for level in (3, 2, 1):
        nested = _zip_bytes([(f"l{level}.zip", nested)])
    (root / "nested.zip").write_bytes(nested)  # nested.zip -> l1.zip -> l2.zip -> l3.zip -> l4.txt: one level too deep
    py7zr = pytest.importorskip("py7zr")
    with py7zr.SevenZipFile(root / "seven.7z", "w") as sz:
        sz.writestr(_text("seven zip"), "notes/seven.txt")

    result = parse_sources(discover([root]))  # archives nest 3 deep at most (tasks.containers.ArchiveLimits)
    docs = {_rel(d.path, root): d for d in result.documents}
    assert set(docs) == {
        "bundle.zip!/a.txt", "bundle.zip!/sub/b.txt", "pack.tgz!/t/one.txt", "pack.tgz!/t/inner.zip!/deep.txt",
        "mail.mbox!/00001-Budget_planning.eml", "mail.mbox!/00001-Budget_planning.eml!/budget.txt",
        "mail.mbox!/00002-Hiring_news.eml", "mail.mbox!/00002-Hiring_news.eml!/hiring.txt",
        "seven.7z!/notes/seven.txt",
    }
    quarantined = {_rel(q.path, root): q.reason for q in result.quarantined}
    assert quarantined == {"bundle.zip!/empty.txt": "empty", "bundle.zip!/../escape.txt": "unsafe_path",
                           "nested.zip!/l1.zip!/l2.zip!/l3.zip": "too_deep"}
    for rel, d in docs.items():
        assert d.doc_id == doc_id_for(str(root / rel)) and d.source == str(root / rel.split("!/")[0])
    assert len({d.content_hash for d in docs.values()}) == len(docs)
    assert docs["bundle.zip!/a.txt"].meta.content_type == "text/plain"
    mail = docs["mail.mbox!/00001-Budget_planning.eml"]
    assert mail.meta.content_type == "message/rfc822" and mail.meta.title == "Budget planning"
    assert "attachment" not in mail.text  # the attachment is its own document, not repeated in the body
    assert result.docs_per_source[str(root / "mail.mbox")] == 4


def test_real_archives_and_mail(docs: Path) -> None:
    names = ["test-documents.tgz", "gbk.zip", "test7Z_protected_passTika.7z", "testRFC822-mixed-with-pdf-inline"]
    result = parse_sources(discover([docs / n for n in names]))
    parsed = {_rel(d.path, docs) for d in result.documents}
    assert {"test-documents.tgz!/test-documents/testPDF.pdf", "test-documents.tgz!/test-documents/testWORD.doc",
            "testRFC822-mixed-with-pdf-inline"} <= parsed
    assert len([p for p in parsed if p.startswith("test-documents.tgz!/")]) == 9
    reasons = {_rel(q.path, docs): q.reason for q in result.quarantined}
    assert reasons["test7Z_protected_passTika.7z"] == "encrypted"
    # GBK member names (no UTF-8 flag) are decoded, not shown as cp437 mojibake
    assert "gbk.zip!/审计压缩包文件检索测试/集团邮件审计系统2021年自动巡检需求文档_V4.0.doc" in reasons
    # the (truncated, empty) inline PDF of the e-mail is quarantined on its own; the body is ingested
    assert reasons["testRFC822-mixed-with-pdf-inline!/tzora-titan-4-hummer-xl-manual.pdf"] == "empty"


def test_archive_reingest_is_idempotent_and_replaces_inner_documents(tmp_path: Path, milvus) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    archive = corpus / "bundle.zip"
    archive.write_bytes(_zip_bytes([("a.txt", _text("alpha")), ("b.txt", _text("beta")), ("c.txt", _text("gamma")),
                                    ("empty.txt", b"")]))
    _mbox(corpus / "mail.mbox", ["Budget planning"])
    embedder = HashEmbedder()
    params = IngestParams(collection="it_archives", chunk=SMALL, prune=True)
    first = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert first.parsed == 5 and first.quarantine_counts == {"empty": 1}
    # its archive holds indexed chunks: no file is quarantined (the /kb page shows bundle.zip indexed)
    assert [q.file_indexed for q in first.quarantined] == [True]
    rows = query_all(milvus, "it_archives", ("id", "path", "doc_id", "content_type", "source"))
    by_path = {r["path"]: r for r in rows}
    assert {p.replace(str(corpus) + "/", "") for p in by_path} == {
        "bundle.zip!/a.txt", "bundle.zip!/b.txt", "bundle.zip!/c.txt", "mail.mbox!/00001-Budget_planning.eml",
        "mail.mbox!/00001-Budget_planning.eml!/budget.txt"}
    assert all(r["source"] in (str(archive), str(corpus / "mail.mbox")) for r in rows)

    again = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert again.writes == 0 and again.unchanged == 2 and again.quarantine_counts == {"empty": 1}
    assert [q.file_indexed for q in again.quarantined] == [True]

    # the archive changes: b.txt edited, c.txt removed -> its inner documents are replaced
    archive.write_bytes(_zip_bytes([("a.txt", _text("alpha")), ("b.txt", _text("beta, edited")), ("empty.txt", b"")]))
    changed = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert changed.processed == 1 and changed.unchanged == 1 and changed.rows_deleted > 0
    paths = {r["path"].rsplit("!/", 1)[-1] for r in query_all(milvus, "it_archives", ("id", "path", "source"))
             if r["source"] == str(archive)}
    assert paths == {"a.txt", "b.txt"}
    fresh = ingest_sources([str(corpus)], params.model_copy(update={"collection": "it_archives_fresh"}), client=milvus,
                       embedder=embedder)
    ids = {r["id"] for r in query_all(milvus, "it_archives", ("id",))}
    assert ids == {r["id"] for r in query_all(milvus, "it_archives_fresh", ("id",))}
    assert changed.total_chunks == fresh.total_chunks

    # the archive is deleted: --prune removes all its inner documents
    archive.unlink()
    pruned = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert pruned.pruned_sources == 1 and not pruned.quarantined
    assert not any(r["source"] == str(archive) for r in query_all(milvus, "it_archives", ("id", "source")))


def test_office_packages_are_documents_not_archives(tmp_path: Path) -> None:
    """OOXML/ODF files are zips, but their parts are never documents of their own, even when
    Tika cannot read the package (OOXML Strict): one entry for the file, no member paths."""
    shared = (Path(__file__).resolve().parents[3] / "shared" / "data" / "docs").resolve()
    package = tmp_path / "book.xlsx"
    package.write_bytes(_zip_bytes([("[Content_Types].xml", b"<Types/>"), ("xl/sharedStrings.xml", _text("pumps"))]))
    sources = discover([str(package)])
    if (shared / "testEXCEL.strict.xlsx").exists():
        sources += discover([str(shared / "testEXCEL.strict.xlsx")])
    result = parse_sources(sources)
    paths = [d.path for d in result.documents] + [q.path for q in result.quarantined]
    assert paths and not any("!/" in p for p in paths)
    assert sorted(set(paths)) == sorted(s.path for s in sources)
