"""README.md is a test: its command blocks run as written, section by section (see harness.py).

``test_readme_is_runnable_as_written`` only reads the README (fast): every code block is a
command block or marked ``not commands``, every skip names its reason and matches a line, every
synopsis has a concrete example. The section tests run the commands in one fresh home, in
README order (a section selected alone runs the sections before it first); each prints its
report (commands, substitutions, skipped lines with reasons, seconds) even when it passes.
"""

from __future__ import annotations

import pytest

from tests.readme import readme_blocks as rb
from tests.readme.harness import Workspace

pytestmark = pytest.mark.readme


def test_readme_is_runnable_as_written() -> None:
    blocks = rb.parse()
    assert not rb.problems(blocks), "\n".join(rb.problems(blocks))
    sections = {c.section for b in blocks for c in b.commands if not c.skip}
    assert sections == set(rb.SECTIONS), f"README sections with no command run: {set(rb.SECTIONS) - sections}"


def test_synopsis_notation_is_recognised() -> None:
    assert rb.synopsis_marks(".venv/bin/python -m flows.rag eval --data qa.jsonl|squad.json")
    assert rb.synopsis_marks(".venv/bin/python -m flows.serve keys revoke KEY_ID")
    assert rb.synopsis_marks(".venv/bin/python -m flows.rag ingest [DOCS_DIR ...]")
    runnable = [
        "curl -s -X POST localhost:8000/v1/kb/search -H \"X-API-Key: $KEY\" -d '{\"top_k\": [5]}'",
        ".venv/bin/python -m flows.fraud train --columns account_id=CUSTOMER_ID,label=TX_FRAUD",
        "INDUSFLOW_KB_COLLECTIONS=default,legal .venv/bin/python -m flows.serve  # a|b [c] DIR",
    ]
    assert [rb.synopsis_marks(t) for t in runnable] == [[], [], []]


@pytest.fixture(scope="session")
def readme_workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("readme"))


@pytest.mark.slow
@pytest.mark.readme_run
@pytest.mark.parametrize("section", list(rb.SECTIONS))
def test_readme_section(section: str, readme_workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    result = readme_workspace.run_through(section)
    with capsys.disabled():
        print("\n" + result.report())
    assert not result.failed, result.failure_message()
