"""milvus-lite's ``pkg_resources`` warning never reaches a command's output, even when another
thread's ``warnings.catch_warnings`` drops the process-wide filter (the CI failure of the
README ``kb_api`` section: ``flows.serve`` logged the warning from a request thread)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("milvus_lite")


def test_once_imported_milvus_lite_never_warns_even_when_the_filter_is_dropped(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import warnings
        warnings.simplefilter("error", UserWarning)  # the pkg_resources warning would raise
        saved = warnings.filters[:]  # what another thread's catch_warnings saved on entry...
        from infra.milvus import import_milvus_lite, open_client
        import_milvus_lite()
        warnings.filters[:] = saved  # ...and restores on exit, dropping our filter
        import milvus_lite  # noqa: F401  (cached: no second warning)
        client = open_client(uri={str(tmp_path / "x.db")!r})
        print("collections", client.list_collections())
        client.close()
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pkg_resources" not in done.stderr
    assert "collections []" in done.stdout
