"""Inbox batch scoring: the processed-files ledger, quarantine, claims, links, machine errors,
and the fan-out on a Dask scheduler and worker started as separate processes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import flows.fraud as F
from flows.fraud.cli import main
from infra.home import home_layout
from infra.registry import ModelRegistry
from solutions.fraud.synthetic import generate_transactions
from tasks.ledger import FileLedger

TINY = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--max-epochs", "1", "--seq-len", "8",
        "--no-baseline"]
MODEL = "fraud-inbox"


@pytest.fixture(scope="module")
def champion() -> str:
    assert main(["train", *TINY, "--model", MODEL]) == 0
    return ModelRegistry().resolve(MODEL).spec


def _transactions(seed: int, days: int = 6) -> pd.DataFrame:
    df = generate_transactions(n_accounts=80, n_terminals=40, n_days=days, seed=seed)
    return df.drop(columns=["is_fraud", "scenario"], errors="ignore")


def test_same_file_twice_is_scored_once_and_bad_files_are_quarantined(tmp_path: Path, champion: str, capsys) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    good = _transactions(seed=11)
    good.to_csv(inbox / "day1.csv", index=False)
    shutil.copy(inbox / "day1.csv", inbox / "day1-copy.csv")  # the same content dropped twice
    good.head(500).to_parquet(inbox / "day2.parquet", index=False)
    (inbox / "broken.parquet").write_bytes(b"PAR1 this is not really parquet")
    good.drop(columns=["amount"]).to_csv(inbox / "no-amount.csv", index=False)
    (inbox / ".hidden.csv").write_text("ignored")
    (inbox / "notes.txt").write_text("not a table")

    assert main(["batch", "--inbox", str(inbox), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["model"] == champion
    assert first["new_files"] == 4  # day1 (its copy is a duplicate), day2, broken, no-amount
    assert first["scored"] == 2 and first["quarantined"] == 2 and first["failed"] == 0
    assert first["rows"] == len(good) + 500
    reasons = {Path(k).name: v for k, v in first["quarantine"].items()}
    assert set(reasons) == {"broken.parquet", "no-amount.csv"}
    assert "amount" in reasons["no-amount.csv"]
    # outputs carry the model version used
    out = pd.read_parquet(first["outputs"][0])
    assert set(out["model_version"]) == {int(champion.split(":")[1])} and out["score"].between(0, 1).all()
    # quarantine keeps a copy and the reason
    qdir = home_layout().quarantine("fraud-batch-score")
    assert any(p.name.endswith("broken.parquet") for p in qdir.iterdir())
    assert any(p.name.endswith("no-amount.csv.reason.json") for p in qdir.iterdir())

    # the same files again (and one more copy under a new name): nothing is scored twice
    shutil.copy(inbox / "day2.parquet", inbox / "day2-again.parquet")
    assert main(["batch", "--inbox", str(inbox), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["new_files"] == 0 and second["scored"] == 0 and second["quarantined"] == 0
    assert second["seen_before"] == 6

    # a fixed file (new content) is scored; the ledger has one line per outcome
    good.head(300).to_csv(inbox / "no-amount.csv", index=False)
    assert main(["batch", "--inbox", str(inbox / "*.csv"), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    third = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert third["scored"] == 1 and third["rows"] == 300
    statuses = [e.status for e in FileLedger("fraud-batch-score").entries().values()]
    assert sorted(statuses) == ["quarantined", "quarantined", "scored", "scored", "scored"]


def test_file_still_being_written_waits_for_the_next_run(tmp_path: Path, champion: str) -> None:
    inbox = tmp_path / "fresh"
    inbox.mkdir()
    _transactions(seed=12, days=3).to_csv(inbox / "now.csv", index=False)
    result = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=3600)
    assert result.new_files == 0 and result.scored == 0


# ------------------------------------------------------------------------------------
# hardening: links, far-future timestamps, machine errors, concurrent runs, remote workers


def _tree_text(root: Path) -> str:
    return "".join(p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*")
                   if p.is_file() and not p.is_symlink() and p.suffix in {".json", ".jsonl", ".csv", ".md"})


def test_links_are_refused_far_future_quarantined_and_formulas_escaped(tmp_path: Path, champion: str) -> None:
    inbox = tmp_path / "hostile"
    inbox.mkdir()
    good = _transactions(seed=31, days=3)
    good["transaction_id"] = good["transaction_id"].astype(str)
    good.loc[0, "transaction_id"] = '=HYPERLINK("http://evil.example","x")'
    good.loc[1, "transaction_id"] = "+cmd|' /C calc'!A0"
    good.to_csv(inbox / "good.csv", index=False)
    future = _transactions(seed=32, days=3).astype({"timestamp": str})
    future.loc[5, "timestamp"] = "2262-04-12 00:00:00"
    future.to_csv(inbox / "future.csv", index=False)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (inbox / "passwd.csv").symlink_to(secret)

    result = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0, csv=True)
    assert result.scored == 1 and result.quarantined == 1 and result.failed == 0
    assert {Path(k).name for k in result.refused} == {"passwd.csv"}
    reason = result.quarantine[str((inbox / "future.csv").resolve())]
    assert "outside the supported range" in reason and "timestamp" in reason
    # the link's target was never read or copied anywhere
    assert "root:x:0:0" not in _tree_text(home_layout().root) and "root:x:0:0" not in result.model_dump_json()
    # the people's CSV escapes formula cells; the Parquet keeps the ids as they are
    csv_text = Path(result.outputs[0]).with_suffix(".csv").read_text()
    assert "'=HYPERLINK(" in csv_text and "'+cmd|" in csv_text and "\n=HYPERLINK" not in csv_text
    assert pd.read_parquet(result.outputs[0])["transaction_id"].str.startswith("=").sum() == 1
    # the next run neither fails nor retries the quarantined file
    again = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0)
    assert again.new_files == 0 and again.seen_before == 2


def test_machine_errors_never_quarantine_and_the_file_is_retried(tmp_path: Path, champion: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.worker_models as WM
    from infra.errors import InfrastructureError

    inbox = tmp_path / "retry"
    inbox.mkdir()
    for seed in (41, 42):
        _transactions(seed=seed, days=3).to_parquet(inbox / f"f{seed}.parquet", index=False)

    def unreachable(ref):
        raise InfrastructureError(f"this worker cannot reach model {ref.spec} at {ref.path}")

    monkeypatch.setattr(WM, "reachable_version", unreachable)
    state = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0, return_state=True)
    assert state.is_failed()
    entries = [e for e in FileLedger("fraud-batch-score").entries().values() if Path(e.path).parent == inbox.resolve()]
    assert sorted(e.status for e in entries) == ["released", "released"]
    assert all("cannot reach model" in e.reason for e in entries)
    qdir = home_layout().quarantine("fraud-batch-score")
    assert not any(p.name.endswith(("f41.parquet", "f42.parquet")) for p in qdir.iterdir())
    monkeypatch.undo()
    fixed = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0)
    assert fixed.scored == 2 and fixed.quarantined == 0 and fixed.seen_before == 0


def test_two_runs_on_one_inbox_score_each_file_exactly_once(tmp_path: Path, champion: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    inbox = tmp_path / "shared"
    inbox.mkdir()
    for seed in range(51, 55):
        _transactions(seed=seed, days=3).to_parquet(inbox / f"f{seed}.parquet", index=False)
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0), range(2)))
    assert sum(r.scored for r in runs) == 4 and all(r.failed == 0 for r in runs)
    outputs = [o for r in runs for o in r.outputs]
    assert len(outputs) == len(set(outputs)) == 4
    scored = [e for e in FileLedger("fraud-batch-score").entries().values()
              if Path(e.path).parent == inbox.resolve() and e.status == "scored"]
    assert len(scored) == 4


def test_batch_on_separate_dask_scheduler_and_worker_processes_with_another_home(
        tmp_path: Path, champion: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers started apart, with their own INDUSFLOW_HOME (no model there): the flow hands
    them the version it resolved, so the good files are scored and only the bad one is quarantined."""
    pytest.importorskip("prefect_dask")
    import os
    import subprocess
    import sys
    import time

    from distributed import Client

    repo = Path(__file__).resolve().parents[2]
    worker_home = tmp_path / "worker-home"
    env = {**os.environ, "PYTHONPATH": str(repo), "INDUSFLOW_HOME": str(worker_home), "OMP_NUM_THREADS": "1",
           "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
                              env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(120):
            if sched_file.exists() and sched_file.stat().st_size:
                break
            time.sleep(0.5)
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                       str(sched_file), "--nworkers", "1", "--nthreads", "2", "--no-dashboard"],
                                      env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(scheduler_file=str(sched_file), timeout=60) as client:
            client.wait_for_workers(1, timeout=120)
            address = client.scheduler.address
        inbox = tmp_path / "remote"
        inbox.mkdir()
        for seed in (61, 62):
            _transactions(seed=seed, days=3).to_parquet(inbox / f"part-{seed}.parquet", index=False)
        (inbox / "bad.csv").write_text("account_id,timestamp\nA,not-a-time\n")
        monkeypatch.setenv("INDUSFLOW_RUNNER_KIND", "dask")
        monkeypatch.setenv("INDUSFLOW_RUNNER_ADDRESS", address)
        result = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0)
        assert result.scored == 2 and result.quarantined == 1 and result.failed == 0, result
        assert all(Path(p).exists() for p in result.outputs)
        assert set(result.quarantine) == {str((inbox / "bad.csv").resolve())}
        assert not (worker_home / "registry").exists() or not any((worker_home / "registry").iterdir())
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_latin1_and_gbk_transactions_score_like_utf8(tmp_path: Path, champion: str, capsys) -> None:
    base = _transactions(seed=71, days=3)
    accented = base.assign(account_id="Zoë-Müller-" + base["account_id"].astype(str),
                           terminal_id="Café-Señor-" + base["terminal_id"].astype(str))
    chinese = base.assign(account_id="账户张三" + base["account_id"].astype(str),
                          terminal_id="北京终端" + base["terminal_id"].astype(str))
    inbox = tmp_path / "encodings"
    inbox.mkdir()
    for name, frame, encoding in (("acc-utf8", accented, "utf-8"), ("acc-latin1", accented, "latin-1"),
                                  ("zh-utf8", chinese, "utf-8"), ("zh-gbk", chinese, "gbk")):
        (inbox / f"{name}.csv").write_bytes(frame.to_csv(index=False).encode(encoding))
    result = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0)
    assert result.scored == 4 and result.quarantined == 0, result.quarantine
    out = {Path(o).name.split("-")[0] + "-" + Path(o).name.split("-")[1]: pd.read_parquet(o) for o in result.outputs}
    pd.testing.assert_frame_equal(out["acc-latin1"], out["acc-utf8"])
    pd.testing.assert_frame_equal(out["zh-gbk"], out["zh-utf8"])
    assert out["zh-gbk"]["account_id"].str.startswith("账户张三").all()
    # the one-file command with the encoding named
    target = tmp_path / "gbk-scores.parquet"
    assert main(["score", "--data", str(inbox / "zh-gbk.csv"), "--encoding", "gbk", "--model", MODEL,
                 "--output", str(target), "--json"]) == 0
    capsys.readouterr()
    named = pd.read_parquet(target)
    assert named["score"].tolist() == out["zh-utf8"]["score"].tolist()
    assert main(["score", "--data", str(inbox / "zh-gbk.csv"), "--encoding", "klingon", "--model", MODEL]) == 2
    assert "--encoding: unknown text encoding" in capsys.readouterr().err


def test_a_single_file_is_scored_in_the_flows_thread_several_on_the_pool(tmp_path: Path) -> None:
    import threading

    from prefect import flow

    from infra.runners import ConfiguredTaskRunner
    from tasks.ledger import FileLedger, InboxFile, ScoredFile, score_inbox

    seen: dict[str, int] = {}

    def score(file: InboxFile) -> ScoredFile:
        seen[Path(file.path).name] = threading.get_ident()
        if "bad" in file.path:
            raise RuntimeError("disk gone")
        return ScoredFile(output=file.path + ".out", rows=1, model="m:1")

    @flow(task_runner=ConfiguredTaskRunner())
    def run(names: list[str]) -> tuple[int, list[str]]:
        for n in names:  # the inbox holds the files (an empty inbox folder reads as an unmounted volume)
            (tmp_path / n).write_text("x")
        files = [InboxFile(path=str(tmp_path / n), sha256=f"{i:064d}", size=1) for i, n in enumerate(names)]
        outcomes = score_inbox(files, score, FileLedger("inline", root=tmp_path))
        return threading.get_ident(), [o.status for o in outcomes]

    flow_thread, statuses = run(["one.csv"])
    assert statuses == ["scored"] and seen["one.csv"] == flow_thread  # no hop to a pool thread
    flow_thread, statuses = run(["a.csv", "b.csv"])
    assert statuses == ["scored", "scored"] and flow_thread not in {seen["a.csv"], seen["b.csv"]}
    _, statuses = run(["bad.csv"])  # a failure in the flow's thread is still caught and released
    assert statuses == ["failed"]
    assert FileLedger("inline", root=tmp_path).entries()[f"{0:064d}"].status == "released"


def test_batch_progress_reaches_100_with_i_of_n_lines(tmp_path: Path, champion: str, caplog, capsys) -> None:
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType

    def progress_artifacts(start: str) -> list[float]:
        with get_client(sync_client=True) as client:
            arts = client.read_artifacts(artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"])))
        return [float(a.data) for a in arts if (a.description or "").startswith(start)]

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for seed in (31, 32):
        _transactions(seed=seed, days=3).to_csv(inbox / f"day{seed}.csv", index=False)
    caplog.set_level(logging.INFO, logger="tasks.progress")
    before = len(progress_artifacts("fraud-batch-score: "))
    assert main(["batch", "--inbox", str(inbox), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["scored"] == 2
    values = progress_artifacts("fraud-batch-score: ")
    assert len(values) == before + 1 and 100.0 in values and all(v == 100.0 for v in values)
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.progress"]
    assert lines[0].startswith("score fraud-batch-score: 0/2 files (0%)")
    assert lines[-1].startswith("score fraud-batch-score: 2/2 files (100%)")


def test_a_file_is_scored_after_its_history_as_the_champion_was_validated(tmp_path: Path, champion: str,
                                                                          capsys) -> None:
    """A batch file's accounts and terminals look back on the champion's training table and on
    the files scored before: its scores equal `score --since` on the whole history, not the
    scores of the file alone (whose windows and sequences would start at its first row)."""
    # the other tests' files reuse the training data's account ids with other people's transactions
    shutil.rmtree(home_layout().batch_history("fraud"))
    ref = ModelRegistry().resolve(MODEL)
    (own,) = home_layout().datasets().glob(f"*-{ref.data_hash}.parquet")
    full = pd.read_parquet(own)
    day = full["timestamp"].max().normalize()
    last = full[full["timestamp"] >= day].drop(columns=["label", "scenario"], errors="ignore")
    before, after = last.iloc[: len(last) // 2], last.iloc[len(last) // 2:]
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    before.to_csv(inbox / "morning.csv", index=False)

    def batch() -> pd.DataFrame:
        assert main(["batch", "--inbox", str(inbox), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
        (output,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["outputs"]
        return pd.read_parquet(output).set_index("transaction_id")["score"]

    def score(data: pd.DataFrame, name: str, since: pd.Timestamp | None = None) -> pd.Series:
        path = tmp_path / f"{name}.parquet"
        data.to_parquet(path, index=False)
        argv = ["score", "--data", str(path), "--model", MODEL, "--output", str(tmp_path / f"{name}-scores.parquet")]
        assert main([*argv, *(["--since", since.isoformat()] if since is not None else []), "--json"]) == 0
        capsys.readouterr()
        return pd.read_parquet(tmp_path / f"{name}-scores.parquet").set_index("transaction_id")["score"]

    morning = batch()
    with_history = score(full[full["timestamp"] < after["timestamp"].min()], "history", since=day)
    alone = score(before, "alone")
    assert len(morning) == len(before)
    assert (morning - with_history.loc[morning.index]).abs().max() < 1e-5
    assert (morning - alone.loc[morning.index]).abs().mean() > 1e-3  # alone, the windows start at its first row

    # the afternoon's file sees the morning's (scored by the batch job, not in the training table)
    # as its history; the training table's labels of the morning are not used
    after.to_csv(inbox / "afternoon.csv", index=False)
    afternoon = batch()
    unlabelled = pd.concat([full[full["timestamp"] < day], before.assign(label=pd.NA)], ignore_index=True)
    expected = score(pd.concat([unlabelled, after], ignore_index=True), "after-morning",
                     since=pd.Timestamp(after["timestamp"].min()))
    assert (afternoon - expected.loc[afternoon.index]).abs().max() < 1e-5


def test_personal_data_in_a_file_name_stays_out_of_outputs_ledger_and_task_runs(
        tmp_path: Path, champion: str, caplog) -> None:
    """A file named after a customer's mobile number: the number reached the output file names,
    the ledger, the quarantine and the Prefect task-run names (issue 26). It passes the redaction
    boundary now, like a document's path; the file itself is still read, and found again."""
    from prefect.client.orchestration import get_client

    inbox = tmp_path / "inbox-pii"
    inbox.mkdir()
    numbers = ("13912345678", "13800138000")
    good = _transactions(seed=41, days=3)
    good.to_csv(inbox / f"客户_{numbers[0]}_day.csv", index=False)
    good.drop(columns=["amount"]).to_csv(inbox / f"客户_{numbers[1]}_bad.csv", index=False)
    caplog.set_level("INFO")

    result = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0, csv=True)
    assert result.scored == 1 and result.quarantined == 1 and result.rows == len(good)
    home = home_layout().root
    names = " ".join(str(p.relative_to(home)) for p in home.rglob("*"))
    shown = [result.model_dump_json(), names, _tree_text(home), caplog.text]
    with get_client(sync_client=True) as client:
        shown.append(" ".join(r.name for r in client.read_task_runs()))
    for number in numbers:
        for where, text in zip(("result", "home file names", "home files", "log", "task runs"), shown, strict=True):
            assert number not in text, f"{number} in the {where}"
    assert Path(result.outputs[0]).exists() and pd.read_parquet(result.outputs[0])["score"].between(0, 1).all()
    # the next run recognises both files from the (redacted) ledger
    again = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0)
    assert again.new_files == 0 and again.seen_before == 2
