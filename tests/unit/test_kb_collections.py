"""Knowledge-base collections (names, folders, Milvus collections), their scopes, and the per-route
limits of the serving middleware."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.home import HomeLayout
from infra.serving.auth import Principal, check_scopes
from infra.serving.runtime import RouteLimits, Services
from infra.settings import ServeSettings
from solutions.rag.collections import check_collection_name, configured_collections, milvus_collection


def test_kb_scopes_are_accepted_and_checked() -> None:
    assert check_scopes(["kb:legal:read", "kb:legal:write", "kb:legal:source", "fraud:score"]) == [
        "fraud:score", "kb:legal:read", "kb:legal:source", "kb:legal:write"]
    for bad in ("kb:Legal:read", "kb:legal:delete", "kb::read", "kb:legal:read:x", "kb:le gal:read"):
        with pytest.raises(ValueError, match="area:resource:read"):
            check_scopes([bad])
    legal = Principal("k1", frozenset({"kb:legal:read"}))
    assert legal.allows("kb:legal:read") and not legal.allows("kb:medical:read") and not legal.allows("kb:legal:write")
    assert not legal.allows("kb:legal:source")  # reading passages is not downloading originals
    assert Principal("k2", frozenset({"admin"})).allows("kb:medical:write")


def test_collections_have_their_own_folder_and_milvus_collection(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("INDUSFLOW_KB_COLLECTIONS", "default, legal,medical,legal")
    monkeypatch.delenv("INDUSFLOW_MILVUS_COLLECTION", raising=False)
    layout = HomeLayout(tmp_path / "home")
    cols = configured_collections(layout)
    assert list(cols) == ["default", "legal", "medical"]
    assert cols["default"].milvus == "rag_chunks" and cols["default"].folder == layout.root / "inbox" / "docs"
    assert cols["legal"].milvus == "legal" and cols["legal"].folder == layout.root / "inbox" / "kb" / "legal"
    assert cols["legal"].folder.is_dir() and cols["medical"].read_scope == "kb:medical:read"
    assert milvus_collection(None) == milvus_collection("default") == "rag_chunks"

    monkeypatch.setenv("INDUSFLOW_KB_COLLECTIONS", "legal,rag_chunks")  # would share default's index
    with pytest.raises(ValueError, match="Milvus collection of 'default'"):
        configured_collections(layout)
    for bad in ("Legal", "legal-team", "1legal", "../x", "a" * 41):
        with pytest.raises(ValueError, match="collection name"):
            check_collection_name(bad)
        monkeypatch.setenv("INDUSFLOW_KB_COLLECTIONS", bad)
        with pytest.raises(ValueError, match="INDUSFLOW_KB_COLLECTIONS"):
            configured_collections(layout)


def test_route_limits_take_the_longest_prefix(tmp_path: Path) -> None:
    services = Services.from_settings(ServeSettings(audit_salt="s", max_body_bytes=1000, request_timeout_s=5),
                                      HomeLayout(tmp_path / "home"))
    services.route_limits["/v1/kb"] = RouteLimits(timeout_s=300)
    services.route_limits["/v1/kb/documents"] = RouteLimits(max_body_bytes=10_000, timeout_s=300)
    assert services.limits_for("/v1/fraud/score") == (1000, 5)
    assert services.limits_for("/v1/kb/ask") == (1000, 300)
    assert services.limits_for("/v1/kb/documents") == (10_000, 300)
    assert services.limits_for("/v1/kb/documents/a.txt") == (10_000, 300)
