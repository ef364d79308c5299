"""Documents named inside their collection (relative to the roots they were ingested from,
unique, redacted) and quarantine reasons in words."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.pii import redact_path
from tasks.catalog import FILE, FOLDER, document_names, load_roots, record_roots, roots_path
from tasks.documents import REASON_TEXT, reason_text


def test_names_are_relative_to_the_deepest_root() -> None:
    roots = {"/srv/inbox/docs": FOLDER, "/data/contracts": FOLDER, "/data/contracts/2024": FOLDER,
             "/tmp/one.pdf": FILE}
    sources = ["/srv/inbox/docs/a.txt", "/data/contracts/lease.pdf", "/data/contracts/2024/sub/x.docx",
               "/tmp/one.pdf", "/elsewhere/legacy/old.txt"]
    assert document_names(sources, roots) == {
        "/srv/inbox/docs/a.txt": "a.txt",
        "/data/contracts/lease.pdf": "lease.pdf",
        "/data/contracts/2024/sub/x.docx": "sub/x.docx",  # the deeper root wins
        "/tmp/one.pdf": "one.pdf",  # a file given by itself: its file name
        "/elsewhere/legacy/old.txt": "old.txt",  # stored before roots were recorded
    }


def test_names_that_would_collide_get_their_folders_in_front() -> None:
    roots = {"/data/2023": FOLDER, "/data/2024": FOLDER, "/x/batch": FOLDER}
    sources = ["/data/2023/report.pdf", "/data/2024/report.pdf", "/x/batch/memo.txt", "/x/batch/unique.txt"]
    names = document_names(sources, roots, taken={"memo.txt"})
    assert names == {"/data/2023/report.pdf": "2023/report.pdf", "/data/2024/report.pdf": "2024/report.pdf",
                     "/x/batch/memo.txt": "batch/memo.txt",  # the watched folder's memo.txt keeps its name
                     "/x/batch/unique.txt": "unique.txt"}
    assert len(set(names.values())) == len(names)
    # identical tails all the way up stay apart by their full path
    deep = document_names(["/a/same/f.txt", "/b/same/f.txt"], {"/a/same": FOLDER, "/b/same": FOLDER})
    assert deep == {"/a/same/f.txt": "a/same/f.txt", "/b/same/f.txt": "b/same/f.txt"}


def test_roots_are_recorded_redacted(tmp_path: Path) -> None:
    folder = tmp_path / "客户_13912345678"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("x")
    single = tmp_path / "single.txt"
    single.write_text("y")
    roots = record_roots("unit_catalog", [folder, single, tmp_path / "missing"])
    assert roots == load_roots("unit_catalog") and roots_path("unit_catalog").is_file()
    stored = redact_path(str(folder.resolve()))
    assert roots == {stored: FOLDER, redact_path(str(single.resolve())): FILE}
    assert "13912345678" not in roots_path("unit_catalog").read_text()
    source = redact_path(str((folder / "sub" / "a.txt").resolve()))
    assert document_names([source], roots) == {source: "sub/a.txt"}


@pytest.mark.parametrize(("code", "text"), [("encrypted", "password-protected"), ("unsupported", "not a document"),
                                            ("empty", "no text found"), ("too_large", "too large"),
                                            ("archive_bomb", "archive bomb"), ("something_new", "not indexed")])
def test_reasons_in_words(code: str, text: str) -> None:
    assert reason_text(code) == text


def test_every_reason_the_parsers_give_has_words() -> None:
    root = Path(__file__).resolve().parents[2]
    import re

    codes = set()
    for module in ("tasks/documents.py", "tasks/containers.py", "infra/ocr.py"):
        source = (root / module).read_text(encoding="utf-8")
        codes |= set(re.findall(r'Quarantined\([^,]+, "([a-z_]+)"', source))
        codes |= set(re.findall(r'(?:fail\(name|Member\([^,]+, None), "([a-z_]+)"', source))
        codes |= set(re.findall(r'OcrError\(.*?, "([a-z_]+)"\)', source))
        codes |= set(re.findall(r'return "([a-z_]+)", ', source))
    assert {"encrypted", "empty", "too_large", "archive_bomb", "ocr_empty", "corrupt"} <= codes
    assert codes <= set(REASON_TEXT), sorted(codes - set(REASON_TEXT))
