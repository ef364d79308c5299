"""README.md and docs/ are a test: their command blocks run as written, section by section (harness.py).

``test_pages_are_runnable_as_written`` only reads the pages (fast): every code block is a command
block or not one (marked ``not commands``, or a fence of another language), every skip names its
reason and matches a line, every synopsis has a concrete example, every runnable command belongs
to a section. The section tests run each section's commands in a home of its own: a fresh one, or
a copy of the home the section it ``needs`` left (:data:`blocks.SECTIONS`, :class:`harness.Pages`).
A section selected alone (``pytest -m docs_run -k serving``) runs exactly its chain of needs first
(fraud_flows, sensor); the whole tier runs each section once. Each prints its report (commands,
substitutions, skipped lines with reasons, seconds; those of the needs it ran) even when it passes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs import blocks as rb
from tests.docs import harness
from tests.docs.harness import Pages, Workspace

pytestmark = pytest.mark.docs


def test_pages_are_runnable_as_written() -> None:
    blocks = rb.parse_all()
    assert not rb.problems(blocks), "\n".join(rb.problems(blocks))
    sections = {c.section for b in blocks for c in b.commands if not c.skip}
    assert sections == set(rb.SECTION_NAMES), f"sections with no command run: {set(rb.SECTION_NAMES) - sections}"


def test_every_page_is_read() -> None:
    pages = {str(p.relative_to(rb.ROOT)) for p in rb.pages()}
    assert {"README.md", "docs/index.md", "docs/serving.md"} <= pages
    assert {s.page for s in rb.SECTIONS} <= pages, "a section names a page that does not exist"


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


def test_fences_and_sections(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Serving\n\n```bash\ncurl -s localhost:8000/readyz\n```\n\n```json\n{\"a\": 1}\n```\n\n"
                    "<!-- docs-test: skip (needs Docker) -->\n\n    docker build .\n", encoding="utf-8")
    blocks = rb.parse(page)
    assert [len(b.commands) for b in blocks] == [1, 0, 1]
    assert blocks[1].not_commands == "a ```json block"
    assert blocks[2].commands[0].skip == "needs Docker"
    assert rb.section_of("docs/fraud.md", ("Fraud detection", "Federated training")) == "federated"
    assert rb.section_of("docs/governance.md", ("Model governance", "Approval")) == "model_risk"
    assert rb.section_of("docs/benchmarks.md", ("Benchmarks",)) is None


def test_mkdocs_build_is_strict(tmp_path: Path) -> None:
    """The documentation site builds with no warning (a broken link, a page missing from the nav)."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=rb.ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_needs_form_chains() -> None:
    """Every ``needs`` names an earlier section, so the tier's order runs each section once."""
    for i, s in enumerate(rb.SECTIONS):
        assert not s.needs or s.needs in rb.SECTION_NAMES[:i], f"{s.name} needs {s.needs!r}: not an earlier section"
    assert rb.chain("serving") == ["fraud_flows", "sensor", "serving"]
    assert rb.chain("kb_api") == ["kb_api"]


GROUPED = '''
import os, pytest
CHAINS = {"a": ["a"], "b": ["a", "b"], "c": ["d", "c"], "d": ["d"], "e": ["a", "e"], "f": ["d", "f"], "g": ["a", "g"],
          "h": ["d", "h"]}
@pytest.mark.parametrize("s", [pytest.param(k, id=k, marks=pytest.mark.xdist_group(v[0])) for k, v in CHAINS.items()])
def test_section(s):
    with open(os.path.join(os.environ["OUT"], s), "w") as fh:
        fh.write(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_xdist_runs_each_chain_of_sections_on_one_worker(tmp_path: Path) -> None:
    """make test-docs relies on ``--dist loadgroup`` to keep a chain of sections on one worker (which then
    runs each needed section once): on pytest 9.2 with pytest-xdist 3.8 it silently stopped grouping
    (pytest-dev/pytest-xdist#1386), and two workers each ran the fraud guide's and the README's chains."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "out").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"OUT": str(tmp_path / "out")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                           "test_grouped.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    worker = {p.name: p.read_text() for p in (tmp_path / "out").iterdir()}
    assert len(worker) == 8
    assert len({worker[s] for s in "abeg"}) == 1 and len({worker[s] for s in "dcfh"}) == 1, worker

def test_a_command_past_its_time_leaves_nothing_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a timed-out command started is killed with it (else it writes into the next section's copy)."""
    monkeypatch.setattr(harness, "COMMAND_TIMEOUT_S", 2)
    ws = Workspace(tmp_path)
    ws.cwd.mkdir()
    ws.home.mkdir()
    cmd = rb.Command("sleep 60 >/dev/null 2>&1 & echo $! > child.pid; wait", 1, "", None)
    outcome = ws._run(cmd, ws.base_env())
    assert outcome.status == "FAILED" and outcome.problems[0].startswith("still running after 2 s")
    child = Path(f"/proc/{(ws.cwd / 'child.pid').read_text().strip()}/stat")
    deadline = time.monotonic() + 5
    while child.exists() and child.read_text().split()[2] != "Z" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not child.exists() or child.read_text().split()[2] == "Z", "the command's child still runs"


@pytest.fixture(scope="session")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Pages:
    return Pages(tmp_path_factory.mktemp("docs"))


def _on_the_worker_of_its_chain(section: rb.Section) -> object:
    """A section with the sections of its chain on one pytest-xdist worker (``--dist loadgroup``):
    a section's needs run once, on the worker that holds their snapshots."""
    return pytest.param(section, id=section.name, marks=pytest.mark.xdist_group(rb.chain(section.name)[0]))


@pytest.mark.slow
@pytest.mark.docs_run
@pytest.mark.parametrize("section", [_on_the_worker_of_its_chain(s) for s in rb.SECTIONS])
def test_docs_section(section: rb.Section, pages: Pages, capsys: pytest.CaptureFixture[str]) -> None:
    ran_before = set(pages.done)
    result = pages.result(section.name)
    with capsys.disabled():
        for name in rb.chain(section.name)[:-1]:
            if name not in ran_before:  # a need this test ran
                print(f"\n(needed by {section.name}) " + pages.done[name].report())
        print("\n" + result.report())
    assert not result.failed, result.failure_message()
