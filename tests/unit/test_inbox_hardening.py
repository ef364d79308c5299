"""The inbox's defences without Prefect: links, content vs machine errors, claims, CSV output."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pandas as pd
import pytest

import tasks.ledger as LG
from infra.errors import DataValidationError, InfrastructureError, RegistryError
from infra.registry import ModelRef
from infra.tables import ColumnSpec, TableSchema, escape_cell, read_table, validate_table, write_table
from tasks.ledger import FileLedger, InboxFile, ScoredFile, reading_content, scan_inbox, score_one
from tasks.worker_models import clear_loaded_models, load_once

SECRET = "root:x:0:0:root:/root:/bin/bash"


def _file(path: Path) -> InboxFile:
    return InboxFile(path=str(path), sha256=LG.sha256_file(path), size=path.stat().st_size,
                     mtime_ns=path.stat().st_mtime_ns)


def test_links_out_of_the_inbox_are_refused_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text(SECRET + "\n")
    (outside / "sub").mkdir()
    (outside / "sub" / "deep.csv").write_text(SECRET + "\n")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "good.csv").write_text("a,b\n1,2\n")
    (inbox / "passwd.csv").symlink_to(outside / "passwd")
    (inbox / "linked-dir").symlink_to(outside / "sub")
    hashed: list[str] = []
    real = LG.sha256_file
    monkeypatch.setattr(LG, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    scan = scan_inbox(inbox, FileLedger("links", root=tmp_path / "l"))
    assert [Path(f.path).name for f in scan.pending] == ["good.csv"]
    assert {Path(k).name for k in scan.refused} == {"passwd.csv"}
    assert "symbolic link" in next(iter(scan.refused.values()))
    assert hashed == ["good.csv"]  # the link's target was never opened
    # a glob through a linked folder does not leave the inbox either
    globbed = scan_inbox(f"{inbox}/**/*.csv", FileLedger("links2", root=tmp_path / "l"))
    assert [Path(f.path).name for f in globbed.pending] == ["good.csv"]
    assert {Path(k).name for k in globbed.refused} == {"passwd.csv", "deep.csv"}


def test_a_file_swapped_for_a_link_is_quarantined_without_reading_or_copying(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    target = inbox / "swap.csv"
    target.write_text("a,b\n1,2\n")
    f = _file(target)
    target.unlink()
    target.symlink_to("/etc/passwd")
    read: list[str] = []
    outcome = score_one(lambda file: read.append(file.path) or ScoredFile(output="x", rows=1, model="m:1"), f)
    assert outcome.status == "quarantined" and "symbolic link" in outcome.reason and read == []
    ledger = FileLedger("swap", root=tmp_path / "l")
    LG.quarantine(f, outcome.reason, ledger)
    copied = list((tmp_path / "home" / "quarantine" / "swap").iterdir())
    assert [p.suffix for p in copied] == [".json"]  # only the reason, never the link's target
    assert "root:x" not in copied[0].read_text()


def test_messages_quote_no_cell_only_a_bounded_redacted_column_list(tmp_path: Path) -> None:
    schema = TableSchema(name="t", columns=(ColumnSpec(name="amount", kind="float"),))
    long_header = SECRET + ":/home/carol/secret-project:/usr/sbin/nologin"
    wide = pd.DataFrame([[1] * 40], columns=[long_header] + [f"c{i}_13712345678" for i in range(39)])
    with pytest.raises(DataValidationError) as err:
        validate_table(wide, schema, "f.csv")
    text = str(err.value)
    assert "13712345678" not in text and "and 28 more" in text and len(text) < 700
    assert "secret-project" not in text and "root:x:0:0" in text  # each name cut to a bounded length
    cells = pd.DataFrame({"amount": ["1.0", "carol@example.net 13712345678"]})
    with pytest.raises(DataValidationError) as err:
        validate_table(cells, schema, "f.csv")
    assert "carol" not in str(err.value) and "1371234" not in str(err.value) and err.value.rows == [1]


def test_far_future_timestamps_are_a_validation_error_not_out_of_bounds(tmp_path: Path) -> None:
    schema = TableSchema(name="t", columns=(ColumnSpec(name="ts", kind="datetime"),))
    df = pd.DataFrame({"ts": ["2024-01-01 10:00", "2262-04-12 00:00", "1600-01-01"]})
    with pytest.raises(DataValidationError, match="outside the supported range") as err:
        validate_table(df, schema, "f.csv")
    assert err.value.column == "ts" and err.value.rows == [1, 2]


def test_content_errors_quarantine_machine_errors_fail_for_retry(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("x")  # a missing file in an empty folder is a volume not mounted here
    f = InboxFile(path=str(tmp_path / "x.csv"), sha256="0" * 64, size=1)

    def content(_: InboxFile) -> ScoredFile:
        with reading_content(f.path):
            pd.Series(["2262-04-12"]).pipe(pd.to_datetime).astype("datetime64[ns]")  # OutOfBoundsDatetime
        raise AssertionError("unreachable")

    outcome = score_one(content, f)
    assert outcome.status == "quarantined" and "OutOfBoundsDatetime" in outcome.reason
    machine = [
        InfrastructureError("worker cannot reach the model"),
        RegistryError("no model named 'x'"),
        PermissionError(errno.EACCES, "Permission denied"),
        OSError(errno.ENOSPC, "No space left on device"),
    ]
    for exc in machine:
        def broken(_: InboxFile, exc: Exception = exc) -> ScoredFile:
            with reading_content(f.path):  # even while reading, the machine's errors stay the machine's
                raise exc

        with pytest.raises(type(exc)):
            score_one(broken, f)


def test_released_files_are_retried_and_never_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.csv").write_text("a\n1\n")
    ledger = FileLedger("retry", root=tmp_path / "l")
    files, _, _ = ledger.claim(scan_inbox(inbox, ledger).pending, LG.run_owner())
    LG.release(files[0], "PermissionError: denied", ledger)
    again = scan_inbox(inbox, ledger)
    assert len(again.pending) == 1 and again.seen_before == 0


def test_claims_give_each_file_to_one_run_even_when_both_scanned(tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    for i in range(12):
        (inbox / f"f{i}.csv").write_text(f"a\n{i}\n")
    ledger_path = tmp_path / "l"
    barrier = threading.Barrier(2)
    got: dict[str, list[str]] = {}

    def run(owner: str) -> None:
        ledger = FileLedger("race", root=ledger_path)
        scan = scan_inbox(inbox, ledger)
        barrier.wait()  # both runs saw all 12 files as new
        claimed, _, _ = ledger.claim(scan.pending, owner)
        got[owner] = [f.sha256 for f in claimed]

    threads = [threading.Thread(target=run, args=(f"{os.uname().nodename}:{os.getpid()}:{n}",)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a, b = got.values()
    assert len(a) + len(b) == 12 and not set(a) & set(b)
    # a claim of a dead process on this host is taken over; a live one is respected
    ledger = FileLedger("race", root=ledger_path)
    pending = scan_inbox(inbox, ledger).pending
    assert ledger.claim(pending, "c")[2] == 12
    dead = LG.LedgerEntry(**{**ledger.entries()[pending[0].sha256].model_dump(),
                             "owner": f"{os.uname().nodename}:999999999:x"})
    ledger.record(dead)
    claimed, _, elsewhere = ledger.claim(pending, "c")
    assert [f.sha256 for f in claimed] == [pending[0].sha256] and elsewhere == 11


def test_a_worker_that_cannot_reach_the_model_fails_clearly(tmp_path: Path) -> None:
    ref = ModelRef(name="m", version=3, path=str(tmp_path / "elsewhere" / "m" / "3"), params={}, metrics={},
                   primary_metric="test/auprc", created_at="2026-01-01T00:00:00")
    with pytest.raises(InfrastructureError, match="cannot reach model m:3 .* shared volume"):
        load_once(ref, lambda r: r)
    folder = Path(ref.path)
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    calls: list[int] = []
    clear_loaded_models()
    for _ in range(3):
        load_once(ref, lambda r: calls.append(1) or "net")
    assert calls == [1]  # once per worker, not per file


def test_csv_output_escapes_formula_cells_and_keeps_numbers(tmp_path: Path) -> None:
    frame = pd.DataFrame({
        "note": ["=HYPERLINK(\"http://x\",\"y\")", "+cmd|' /C calc'!A0", "-1.5", "@SUM(A1)", "\tTAB", "\rCR", "plain",
                 "-2+3"],
        "amount": [-1.5, 2.0, -3.0, 0.0, 1.0, 1.0, 1.0, 1.0],
    })
    csv_path = write_table(frame, tmp_path / "out.parquet", csv=True)
    back = pd.read_csv(csv_path, keep_default_na=False)
    assert back["note"].tolist() == ["'=HYPERLINK(\"http://x\",\"y\")", "'+cmd|' /C calc'!A0", "-1.5", "'@SUM(A1)",
                                     "'\tTAB", "'\rCR", "plain", "'-2+3"]
    assert back["amount"].tolist() == [-1.5, 2.0, -3.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert pd.read_parquet(tmp_path / "out.parquet")["note"].iloc[0].startswith("=")  # data untouched
    assert escape_cell(-1.5) == -1.5 and escape_cell("1e-5") == "1e-5"


@pytest.mark.parametrize("encoding", ["latin-1", "gbk"])
def test_non_utf8_csv_is_detected_and_read_like_utf8(tmp_path: Path, encoding: str) -> None:
    names = ["Zoë Müller", "Café Señor", "Renée Ørsted"] if encoding == "latin-1" else ["北京商户", "上海终端", "账户张三"]
    frame = pd.DataFrame({"account_id": [f"{names[i % 3]}-{i}" for i in range(300)],
                          "amount": [i * 1.25 for i in range(300)]})
    (tmp_path / "u.csv").write_bytes(frame.to_csv(index=False).encode("utf-8"))
    (tmp_path / "x.csv").write_bytes(frame.to_csv(index=False).encode(encoding))
    pd.testing.assert_frame_equal(read_table(tmp_path / "x.csv"), read_table(tmp_path / "u.csv"))
    pd.testing.assert_frame_equal(read_table(tmp_path / "x.csv", encoding), read_table(tmp_path / "u.csv"))
    with pytest.raises(DataValidationError, match="unknown text encoding"):
        read_table(tmp_path / "x.csv", "no-such-codec")


def test_a_run_that_finds_every_file_claimed_says_so_in_its_result(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The log said "4 claimed by another run" while the run's JSON said claimed_elsewhere: 0."""
    import infra.registry

    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(infra.registry.ModelRegistry, "resolve", lambda self, spec: ModelRef(
        name="m", version=1, path=str(tmp_path), params={}, metrics={}, primary_metric="test/auprc",
        created_at="2026-01-01T00:00:00"))
    inbox = tmp_path / "in"
    inbox.mkdir()
    for i in range(4):
        (inbox / f"f{i}.csv").write_text(f"a\n{i}\n")
    ledger = FileLedger("busy")
    other = f"{os.uname().nodename}:{os.getpid()}:other-run"  # a live process: its claims are respected
    assert len(ledger.claim(scan_inbox(inbox, ledger, settle_s=0).pending, other)[0]) == 4
    run = LG.process_inbox("busy", str(inbox), "m", lambda ref: None, settle_s=0)
    assert run.new_files == 0 and run.claimed_elsewhere == 4


def test_a_worker_that_does_not_see_the_inbox_releases_the_file(tmp_path: Path) -> None:
    """A worker with the registry but without the inbox volume used to quarantine every good file
    ("file not found"); now the file fails as the machine's error and is released. A file deleted
    from a folder the worker does see is still the file's own problem (quarantined)."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "good.csv").write_text("a\n1\n")
    seen = _file(inbox / "good.csv")

    def score(f: InboxFile) -> ScoredFile:
        with reading_content(f.path):
            read_table(Path(f.path))
        raise AssertionError("not reached")

    unseen = seen.model_copy(update={"path": str(tmp_path / "not-mounted" / "good.csv")})
    with pytest.raises(InfrastructureError, match="cannot see the inbox folder"):
        score_one(score, unseen)
    (tmp_path / "empty-mount-point").mkdir()  # the volume is not mounted on this worker (issue 46)
    unmounted = seen.model_copy(update={"path": str(tmp_path / "empty-mount-point" / "good.csv")})
    with pytest.raises(InfrastructureError, match="cannot see the inbox folder"):
        score_one(score, unmounted)  # main's code quarantined the good file as unreadable
    (inbox / "other.csv").write_text("a\n2\n")
    (inbox / "good.csv").unlink()
    assert score_one(score, seen).status == "quarantined"
