"""A file that stops an ingest (the process killed or out of time while it is parsed) is
quarantined and not parsed again by later runs until it changes (issue 46: a zip of zips re-ingested
by every job of its collection); a run that fails with an error (an endpoint down) marks nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("iscc_tika")

from flows.rag.steps import ingest_sources
from solutions.rag.config import ChunkParams, IngestParams
from tasks.documents import parse_sources
from tasks.ingest import IngestStages, load_quarantine_cache, quarantine_unfinished

sys.path.insert(0, str(Path(__file__).parent))
from _hash_embedder import HashEmbedder
from test_rag_ingest_pipeline import ThreadRecordingEmbedder


class Killed(BaseException):
    """The process dies while a file is parsed (SIGKILL, out of memory): nothing after it runs."""


def _corpus(folder: Path) -> Path:
    folder.mkdir()
    for name in ("a-good.txt", "stuck.txt", "z-good.txt"):
        (folder / name).write_text(f"The {name} report of the Brightwater depot lists pallets, pumps and pressure "
                                   "readings for the third quarter.")
    return folder


class Parser:
    """Parses as the ingest does, remembering each file it was given; dies on ``stuck.txt`` while armed."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.armed = True

    def __call__(self, batch, **kwargs):
        self.seen += [Path(f.path).name for f in batch]
        if self.armed and any(Path(f.path).name == "stuck.txt" for f in batch):
            raise Killed
        return parse_sources(batch, **kwargs)


def _ingest(corpus: Path, params: IngestParams, milvus, parser: Parser, embedder=None):
    return ingest_sources([str(corpus)], params, client=milvus, embedder=embedder or HashEmbedder(),
                          stages=IngestStages(parse=parser, overlap=0))


def test_a_file_that_stops_two_runs_is_quarantined_until_it_changes(tmp_path: Path, milvus) -> None:
    corpus = _corpus(tmp_path / "corpus")
    params = IngestParams(collection="it_unfinished", chunk=ChunkParams(tokens=48, overlap=12), batch_docs=1)
    parser = Parser()
    for _ in range(2):  # killed twice on the same file (one stop is forgiven: a restart)
        with pytest.raises(Killed):
            _ingest(corpus, params, milvus, parser)
    parser.armed, parser.seen = False, []
    result = _ingest(corpus, params, milvus, parser)
    assert "stuck.txt" not in parser.seen  # main's code parsed it again on every run
    assert [(Path(q.path).name, q.reason) for q in result.quarantined] == [("stuck.txt", "unfinished")]
    parser.seen = []
    assert _ingest(corpus, params, milvus, parser).quarantined[0].reason == "unfinished"
    assert parser.seen == []  # still skipped, nothing else to do
    (corpus / "stuck.txt").write_text("The stuck report, fixed: the Brightwater pumps hold their pressure.")
    result = _ingest(corpus, params, milvus, parser)
    assert parser.seen == ["stuck.txt"] and result.quarantined == []  # changed: parsed again, indexed


def test_a_file_a_run_ran_out_of_time_on_is_quarantined_at_once(tmp_path: Path, milvus) -> None:
    corpus = _corpus(tmp_path / "corpus")
    params = IngestParams(collection="it_timed_out", chunk=ChunkParams(tokens=48, overlap=12), batch_docs=1)
    parser = Parser()
    with pytest.raises(Killed):  # what the API's time limit does: the run's process is killed
        _ingest(corpus, params, milvus, parser)
    assert quarantine_unfinished("it_timed_out", detail="ran past 60 s") == 1
    parser.armed, parser.seen = False, []
    result = _ingest(corpus, params, milvus, parser)
    assert "stuck.txt" not in parser.seen and "z-good.txt" in parser.seen
    assert [(Path(q.path).name, q.reason) for q in result.quarantined] == [("stuck.txt", "timed_out")]


def test_a_run_that_fails_with_an_error_quarantines_nothing(tmp_path: Path, milvus) -> None:
    corpus = _corpus(tmp_path / "corpus")
    params = IngestParams(collection="it_failing", chunk=ChunkParams(tokens=48, overlap=12), batch_docs=1)
    parser = Parser()
    parser.armed = False
    for _ in range(3):  # the embeddings endpoint is down three times
        with pytest.raises(Exception, match="refuses"):
            _ingest(corpus, params, milvus, parser, ThreadRecordingEmbedder(fail_on="stuck.txt"))
    assert not any(e.get("unfinished") for e in load_quarantine_cache("it_failing").values())
    result = _ingest(corpus, params, milvus, parser)
    assert result.quarantined == [] and "stuck.txt" in parser.seen[-3:]
