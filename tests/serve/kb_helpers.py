"""A folder as a user hands it to ``python -m flows.rag ingest`` (the API and page tests)."""

from __future__ import annotations

from pathlib import Path

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
