"""One source of truth for quarantine counts and reasons: the CLI's ingest summary counts and
words the quarantined files as the /kb page's documents list does (issue 51: 17 items on the
command line, 15 files on the page, reasons as codes there and words here)."""

from __future__ import annotations

from dataclasses import dataclass

from solutions.rag.library import quarantined_files, status_of
from tasks.documents import reason_text
from tasks.ingest import QuarantineItem


@dataclass
class State:
    """An indexed file's record (what the page reads from the store)."""

    chunks: dict[str, int]

    def complete(self, source_hash: str) -> bool:
        return True


ITEMS = [
    QuarantineItem(path="/kb/broken.pdf", reason="corrupt"),
    QuarantineItem(path="/kb/locked.zip!/a.docx", reason="encrypted"),
    QuarantineItem(path="/kb/locked.zip!/b.pdf", reason="corrupt"),
    QuarantineItem(path="/kb/mixed.tgz!/x.bin", reason="unsupported", file_indexed=True),  # its other members indexed
    QuarantineItem(path="/kb/mail.eml!/photo.zip!/deep.one", reason="unsupported"),
]


def test_the_cli_counts_and_words_files_as_the_documents_list_does() -> None:
    files = quarantined_files(ITEMS, reason_text)
    # what the page shows for each file, from the same records (quarantine cache + store)
    page = {}
    for source in ("/kb/broken.pdf", "/kb/locked.zip", "/kb/mixed.tgz", "/kb/mail.eml"):
        items = [{"path": q.path, "reason": q.reason} for q in ITEMS
                 if q.path == source or q.path.startswith(source + "!/")]
        state = State({"x": 3}) if any(q.file_indexed for q in ITEMS if q.path.startswith(source)) else None
        status, _, reason, _ = status_of(source, "h", state, {"hash": "h", "items": items}, reason_text)
        if status == "quarantined":
            page[source] = reason
    assert files == page
    assert len(ITEMS) == 5 and len(files) == 3  # items are not files: an archive counts once, an indexed one not at all
    assert files["/kb/locked.zip"] == f"2 members not indexed: {reason_text('encrypted')}"
    assert files["/kb/broken.pdf"] == reason_text("corrupt")
