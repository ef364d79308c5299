"""The processed-files ledger and inbox scan, without Prefect."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import tasks.ledger as LG
from infra.errors import DataValidationError
from tasks.ledger import FileLedger, InboxFile, LedgerEntry, ScoredFile, list_inbox, scan_inbox, score_one


def _entry(f: InboxFile, status: str = "scored") -> LedgerEntry:
    return LedgerEntry(sha256=f.sha256, path=f.path, size=f.size, mtime_ns=f.mtime_ns, status=status)


def test_inbox_listing_skips_hidden_partial_and_other_files(tmp_path: Path) -> None:
    for name in ("a.csv", "b.PARQUET", "c.pq", ".hidden.csv", "d.csv.part", "e.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.csv").write_text("y")
    assert [p.name for p in list_inbox(tmp_path)] == ["a.csv", "b.PARQUET", "c.pq"]
    assert [p.name for p in list_inbox(f"{tmp_path}/**/*.csv")] == ["a.csv", "f.csv"]
    assert list_inbox(tmp_path / "missing") == []


def test_scan_keys_on_content_and_skips_rehashing_untouched_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.csv").write_text("1,2\n")
    (inbox / "a-copy.csv").write_text("1,2\n")
    (inbox / "b.csv").write_text("3,4\n")
    ledger = FileLedger("unit", root=tmp_path / "ledgers")
    scan = scan_inbox(inbox, ledger)
    assert [Path(f.path).name for f in scan.pending] == ["a-copy.csv", "b.csv"] and scan.duplicates == 1
    for f in scan.pending:
        ledger.record(_entry(f))
    calls: list[Path] = []
    real = LG.sha256_file
    monkeypatch.setattr(LG, "sha256_file", lambda p: calls.append(p) or real(p))
    again = scan_inbox(inbox, ledger)
    assert again.pending == [] and again.seen_before == 3
    assert [p.name for p in calls] == ["a.csv"]  # only the file never recorded under its own path
    (inbox / "b.csv").write_text("5,6\n")  # changed content: scored again
    assert [Path(f.path).name for f in scan_inbox(inbox, ledger).pending] == ["b.csv"]


def test_recently_modified_files_wait(tmp_path: Path) -> None:
    (tmp_path / "new.csv").write_text("1\n")
    old = tmp_path / "old.csv"
    old.write_text("2\n")
    past = time.time() - 120
    os.utime(old, (past, past))
    scan = scan_inbox(tmp_path, FileLedger("settle", root=tmp_path / "l"), settle_s=30)
    assert [Path(f.path).name for f in scan.pending] == ["old.csv"] and scan.settling == 1


def test_bad_input_is_quarantined_other_errors_raise(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("x")  # a missing file in an empty folder is a volume not mounted here
    f = InboxFile(path=str(tmp_path / "x.csv"), sha256="0" * 64, size=1)

    def bad(_: InboxFile) -> ScoredFile:
        raise DataValidationError("missing required column(s) ['amount']", source=f.path)

    def broken(_: InboxFile) -> ScoredFile:
        raise KeyError("a bug, not a bad file")

    outcome = score_one(bad, f)
    assert outcome.status == "quarantined" and "amount" in outcome.reason and f.path in outcome.reason
    with pytest.raises(KeyError):
        score_one(broken, f)
    good = score_one(lambda _: ScoredFile(output="o.parquet", rows=3, model="m:1"), f)
    assert good.status == "scored" and good.scored.rows == 3


def test_torn_last_line_is_ignored_and_last_entry_wins(tmp_path: Path) -> None:
    ledger = FileLedger("torn", root=tmp_path)
    f = InboxFile(path="/in/a.csv", sha256="a" * 64, size=3)
    ledger.record(_entry(f, "quarantined"))
    ledger.record(_entry(f, "scored"))
    with open(ledger.path, "a") as handle:
        handle.write('{"sha256": "bbb", "pa')  # a crash mid-write
    entries = ledger.entries()
    assert list(entries) == ["a" * 64] and entries["a" * 64].status == "scored"
    with pytest.raises(ValueError):
        FileLedger("../escape", root=tmp_path)


def test_entry_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    ledger = FileLedger("torn-then-more", root=tmp_path)
    a, b = (InboxFile(path=f"/in/{n}.csv", sha256=n * 64, size=3) for n in "ab")
    ledger.record(_entry(a))
    with open(ledger.path, "a") as handle:
        handle.write('{"sha256": "ccc", "pa')  # a crash mid-write
    assert set(ledger.entries()) == {"a" * 64}
    ledger.record(_entry(b, "quarantined"))  # the next run appends: not glued to the torn line
    entries = FileLedger("torn-then-more", root=tmp_path).entries()
    assert set(entries) == {"a" * 64, "b" * 64} and entries["b" * 64].status == "quarantined"


def test_reads_only_what_was_appended_and_rereads_a_replaced_file(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    files = [InboxFile(path=f"/in/{i}.csv", sha256=f"{i:064d}", size=3) for i in range(50)]
    writer = FileLedger("grows", root=tmp_path)
    for f in files[:40]:
        writer.record(_entry(f, "claimed"))
    assert len(FileLedger("grows", root=tmp_path).entries()) == 40
    parsed: list[str] = []
    real = LedgerEntry.model_validate_json
    monkeypatch.setattr(LedgerEntry, "model_validate_json", lambda line: parsed.append(line) or real(line))
    for f in files[40:]:
        writer.record(_entry(f))
    writer.record(_entry(files[0], "scored"))
    entries = FileLedger("grows", root=tmp_path).entries()  # another instance, same process
    assert len(parsed) == 11 and len(entries) == 50  # the 11 new lines only, not 51
    assert entries[files[0].sha256].status == "scored" and entries[files[1].sha256].status == "claimed"
    entries.clear()  # a caller's copy: the next read is whole again
    assert len(writer.entries()) == 50 and len(parsed) == 11
    # the file replaced (e.g. restored from a backup): read again from the start
    replacement = tmp_path / "new.jsonl"
    replacement.write_text(_entry(files[7], "quarantined").model_dump_json() + "\n")
    os.replace(replacement, writer.path)
    entries = writer.entries()
    assert list(entries) == [files[7].sha256] and entries[files[7].sha256].status == "quarantined"
