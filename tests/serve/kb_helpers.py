"""A folder as a user hands it to ``python -m flows.rag ingest``, and a KB server on a thread
(the API, jobs and page tests)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from tests.serve.fraud_helpers import free_port


@contextmanager
def environment(updates: Mapping[str, str], removed: tuple[str, ...] = ()) -> Iterator[None]:
    """``os.environ`` with ``updates`` set and ``removed`` unset, restored afterwards."""
    saved = {k: os.environ.get(k) for k in [*updates, *removed]}
    os.environ.update(updates)
    for k in removed:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def serving(app: Any, join_s: float = 30, start_s: float = 20, **config: Any) -> Iterator[str]:
    """``app`` on a real uvicorn on 127.0.0.1 (a thread; ``config``: more ``uvicorn.Config``
    options); yields its URL once it listens."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False,
                                           **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_s
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=join_s)

#: The names the documents list gives its files (relative to the folder ingested).
CLI_NAMES = ("blob.bin", "broken.pdf", "locked.7z", "notes.html", "reports/q3-summary.txt")
#: The reasons in words of the three that cannot be indexed.
CLI_REASONS = {"locked.7z": "password-protected", "blob.bin": "not a document",
               "broken.pdf": "damaged or not a valid file"}


def cli_folder(root: Path) -> Path:
    """A folder as a user hands it to ``python -m flows.rag ingest``: two good documents (one in a
    subfolder) and three that cannot be indexed (a password-protected 7z, random bytes, a PDF
    whose parser fails with a Java exception)."""
    import py7zr

    folder = root / "client-files"
    (folder / "reports").mkdir(parents=True)
    (folder / "reports" / "q3-summary.txt").write_text(
        "Q3 summary of the Brightwater depot.\n\nThe Brightwater depot shipped 4,812 pallets in the third "
        "quarter, twelve percent more than planned.\n", encoding="utf-8")
    (folder / "notes.html").write_text("<html><head><title>Depot notes</title></head><body><p>The loading dock "
                                       "of the Brightwater depot closes at nine in the evening.</p></body></html>")
    with py7zr.SevenZipFile(folder / "locked.7z", "w", password="s3cret") as z:
        z.writestr(b"Vault codes of the depot.\n" * 5, "codes.txt")
    (folder / "blob.bin").write_bytes(bytes((i * 7919 + 13) % 256 for i in range(4096)))
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    return folder


def pdf_with_pages(pages: list[list[str]]) -> bytes:
    """A PDF with one page per item of ``pages``, each line of it a line of Helvetica text (a
    real text layer, so Tika reports its per-page character counts)."""

    def escaped(line: str) -> str:
        return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    n = len(pages)
    font = 3 + 2 * n
    objects = ["<< /Type /Catalog /Pages 2 0 R >>",
               "<< /Type /Pages /Kids [" + " ".join(f"{3 + 2 * i} 0 R" for i in range(n)) + f"] /Count {n} >>"]
    for i, lines in enumerate(pages):
        stream = "BT /F1 11 Tf 14 TL 56 760 Td " + " ".join(f"({escaped(line)}) Tj T*" for line in lines) + " ET"
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 {font} 0 R >> >> "
                       f"/Contents {4 + 2 * i} 0 R >>")
        objects.append(f"<< /Length {len(stream.encode('latin-1'))} >>\nstream\n{stream}\nendstream")
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{off:010d} 00000 n \n" for off in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)
