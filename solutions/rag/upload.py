"""Document uploads streamed straight into a collection's watched folder.

The multipart body is parsed as it arrives (``python-multipart``): each file goes to a hidden
temporary file inside the collection's folder (ingest skips hidden names) and is renamed into
place once the whole request has arrived, so no document is ever written outside the configured
folders (Starlette's own form parser would spool large files to the system temp folder) and a
refused or broken upload leaves nothing behind. The collection must therefore be known before
the first file: as ``?collection=`` or as a ``collection`` field sent before the files.

Caps per upload (each refusal names its limit): the files of one request (``INDUSFLOW_KB_MAX_UPLOAD_FILES``, 422),
their bytes together (``INDUSFLOW_KB_MAX_UPLOAD_BYTES``, 413, counted as they arrive) and the
archive members of all its archives together (``max_members``, 422, counted from the archives'
directories once the body has arrived, before anything is renamed into the folder).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.multipart import MultipartParser, parse_options_header

from solutions.rag.collections import KbCollection
from solutions.rag.library import UploadRefused, safe_document_name

UPLOAD_PREFIX = ".upload-"  # hidden: ingest skips files whose name starts with a dot
FILES_FIELD = "files"
COLLECTION_FIELD = "collection"
MAX_FIELD_BYTES = 1024


@dataclass
class StagedFile:
    """One uploaded file written to a hidden temporary file in the folder."""

    name: str
    tmp: Path
    size: int = 0


@dataclass
class Upload:
    """What a finished upload holds: its collection and the files staged in its folder."""

    collection: KbCollection | None = None
    files: list[StagedFile] = field(default_factory=list)
    members: int = 0  # archive members of all the files together

    def discard(self) -> None:
        """Remove the staged files (a refused or broken upload leaves nothing)."""
        for f in self.files:
            f.tmp.unlink(missing_ok=True)

    def commit(self) -> int:
        """Rename every staged file into place; returns the bytes stored.

        Raises:
            UploadRefused: a target is a symbolic link or not a regular file (409); nothing is
                renamed then.
        """
        assert self.collection is not None
        folder = self.collection.folder.resolve()
        for f in self.files:
            target = folder / f.name
            if target.is_symlink() or (target.exists() and not target.is_file()):
                raise UploadRefused(f"{f.name!r} exists in the collection's folder and is not a regular file", 409)
        for f in self.files:
            os.replace(f.tmp, folder / f.name)
        return sum(f.size for f in self.files)


class UploadParser:
    """Feeds a multipart body into an :class:`Upload`.

    Args:
        boundary: the multipart boundary of the request.
        collection_for: turns the collection name into the collection the caller may write
            (raises the HTTP refusal otherwise); called once, before the first file is written.
        query_collection: the collection named in the URL, if any.
        max_bytes: the most bytes of all the files together (413 above).
        max_files: the most files (422 above).
        max_members: the most archive members of all the files together (422 above).
        count_members: the members of a file that is an archive (0 for any other file),
            counting at most its second argument plus one.
    """

    def __init__(self, boundary: bytes, collection_for: Callable[[str], KbCollection], *,
                 query_collection: str | None, max_bytes: int, max_files: int, max_members: int | None = None,
                 count_members: Callable[[Path, int], int] | None = None) -> None:
        self.upload = Upload()
        self.collection_for = collection_for
        self.collection_name = query_collection
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.max_members = max_members
        self.count_members = count_members
        self.received = 0
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""
        self._field: str | None = None
        self._value = bytearray()
        self._file: StagedFile | None = None
        self._out: IO[bytes] | None = None
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin, "on_header_field": self._header_field,
            "on_header_value": self._header_value_part, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        })

    async def feed(self, chunks: AsyncIterator[bytes]) -> Upload:
        """Parse the whole body; on any error the staged files are removed and the error raised."""
        try:
            async for chunk in chunks:
                if chunk:
                    self.parser.write(chunk)
            self.parser.finalize()
            if self._out is not None:
                raise UploadRefused("the upload ended in the middle of a file")
            self.upload.members = await asyncio.to_thread(self._members)  # reads archive directories
        except BaseException:
            self._close_current()
            self.upload.discard()
            raise
        return self.upload

    def _members(self) -> int:
        """Archive members of all the staged files together (UploadRefused above the cap)."""
        if self.count_members is None or self.max_members is None:
            return 0
        total = 0
        for f in self.upload.files:
            total += self.count_members(f.tmp, self.max_members - total)
            if total > self.max_members:
                raise UploadRefused(f"the archives of this upload hold more than {self.max_members} members together"
                                    ": send fewer at a time")
        return total

    # -- callbacks of python-multipart
    def _part_begin(self) -> None:
        self._disposition, self._field, self._value = b"", None, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_part(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name, self._header_value = b"", b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise UploadRefused('a form part lacks Content-Disposition "name"')
        self._field = options[b"name"].decode("utf-8", "replace")
        if b"filename" not in options:
            return
        if self._field != FILES_FIELD:
            raise UploadRefused(f"files go in the form field {FILES_FIELD!r}")
        if len(self.upload.files) >= self.max_files:
            raise UploadRefused(f"more than {self.max_files} files in one upload (INDUSFLOW_KB_MAX_UPLOAD_FILES)")
        if self.upload.collection is None:
            if not self.collection_name:
                raise UploadRefused(f"name the collection before the files: ?{COLLECTION_FIELD}= or a "
                                    f"{COLLECTION_FIELD!r} field sent first")
            self.upload.collection = self.collection_for(self.collection_name)
        try:
            name = safe_document_name(options[b"filename"].decode("utf-8", "replace"))
        except ValueError as exc:
            raise UploadRefused(str(exc)) from None
        if any(f.name == name for f in self.upload.files):
            raise UploadRefused(f"two files of the upload are named {name!r}")
        configured = self.upload.collection.folder
        if configured.is_symlink() or not configured.is_dir():  # checked before resolve() follows a link
            raise UploadRefused("the collection's watched folder is not a plain folder", 409)
        folder = configured.resolve()
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=UPLOAD_PREFIX)
        os.fchmod(fd, 0o640)
        self._file = StagedFile(name=name, tmp=Path(tmp))
        self.upload.files.append(self._file)
        self._out = os.fdopen(fd, "wb")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._out is not None and self._file is not None:
            self._file.size += end - start
            self.received += end - start
            if self.received > self.max_bytes:
                raise UploadRefused(f"the files of this upload are over {self.max_bytes} bytes together "
                                    "(INDUSFLOW_KB_MAX_UPLOAD_BYTES)", 413)
            self._out.write(data[start:end])
            return
        self._value.extend(data[start:end])
        if len(self._value) > MAX_FIELD_BYTES:
            raise UploadRefused(f"the form field {self._field!r} is over {MAX_FIELD_BYTES} bytes")

    def _part_end(self) -> None:
        if self._out is not None:
            self._close_current()
            return
        if self._field == COLLECTION_FIELD and self.collection_name is None:
            self.collection_name = self._value.decode("utf-8", "replace").strip()

    def _close_current(self) -> None:
        if self._out is not None:
            self._out.close()
        self._out, self._file = None, None


def multipart_boundary(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` content type (UploadRefused if it is not one)."""
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        raise UploadRefused("send the files as multipart/form-data")
    return options[b"boundary"]
