"""Knowledge-base collections: named, separately indexed corpora (``legal``, ``medical``).

Each collection has its own Milvus collection (dense vectors and BM25 statistics never mix, so
a reader of one collection can neither retrieve nor rank against another's passages) and its own
watched folder under the home. ``default`` is today's single knowledge base: the Milvus
collection ``INDUSFLOW_MILVUS_COLLECTION`` (``rag_chunks``) and the folder ``<home>/inbox/docs``.
Any other name is the Milvus collection of that name and ``<home>/inbox/kb/<name>``. The API
serves the collections listed in ``INDUSFLOW_KB_COLLECTIONS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from infra.home import HomeLayout, home_layout
from infra.settings import get_kb_settings, get_milvus_settings

DEFAULT = "default"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def check_collection_name(name: str) -> str:
    """``name`` when it is a valid collection name, else ValueError saying what is allowed."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"collection name {name!r}: use 1-40 lower-case letters, digits or '_', starting with a letter")
    return name


def milvus_collection(name: str | None) -> str | None:
    """The Milvus collection of a knowledge-base collection name (None and ``default``: the
    configured default collection; any other name stands for itself)."""
    if name is None or name == DEFAULT:
        return get_milvus_settings().collection
    return name


@dataclass(frozen=True)
class KbCollection:
    """One knowledge-base collection.

    Attributes:
        name: its name in the API and in scopes (``legal``).
        milvus: its Milvus collection.
        folder: its watched folder (uploads land here; its ingest reads it).
    """

    name: str
    milvus: str
    folder: Path

    @property
    def read_scope(self) -> str:
        return f"kb:{self.name}:read"

    @property
    def write_scope(self) -> str:
        return f"kb:{self.name}:write"


def kb_collection(name: str, layout: HomeLayout | None = None) -> KbCollection:
    """The collection ``name`` (valid name required; it need not be configured)."""
    check_collection_name(name)
    layout = layout or home_layout()
    milvus = milvus_collection(name)
    assert milvus is not None
    return KbCollection(name=name, milvus=milvus, folder=layout.kb_inbox(name))


def configured_collections(layout: HomeLayout | None = None) -> dict[str, KbCollection]:
    """The collections of ``INDUSFLOW_KB_COLLECTIONS``, by name, in order.

    Raises:
        ValueError: a bad name, none at all, or a name that is the default collection's Milvus
            collection under another name (two names would then share one index and its access).
    """
    names = get_kb_settings().names()
    if not names:
        raise ValueError("INDUSFLOW_KB_COLLECTIONS names no collection (e.g. default,legal,medical)")
    out: dict[str, KbCollection] = {}
    default_milvus = get_milvus_settings().collection
    for name in names:
        try:
            check_collection_name(name)
        except ValueError as exc:
            raise ValueError(f"INDUSFLOW_KB_COLLECTIONS: {exc}") from None
        if name != DEFAULT and name == default_milvus:
            raise ValueError(f"INDUSFLOW_KB_COLLECTIONS: {name!r} is the Milvus collection of 'default'; "
                             "name it 'default' or choose another name")
        out[name] = kb_collection(name, layout)
    return out


def watched_folder_of(name: str | None) -> Path:
    """The watched folder of a collection (``None``: ``default``), created if missing.

    A Milvus collection name given for ``default`` (``rag_chunks``) means ``default``.
    """
    if name is None or name == get_milvus_settings().collection:
        name = DEFAULT
    return home_layout().kb_inbox(name)
