"""The embedded online state store (RocksDB): a process killed with SIGKILL between or inside commits
loses no committed update and tears none (a transaction id's owner included: none lost, none
without its transaction, none kept past its retention); a second process cannot open a folder in use and is told
to use Redis; several store objects of one process share one database and see each other's commits
through the generation; a terminal's newest rows come back in time order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infra.online_state import ACCOUNT, TERMINAL, Journal
from infra.online_state.rocks import RocksStateStore

ROOT = Path(__file__).resolve().parents[2]

_WRITER = """
import sys
from pathlib import Path
from infra.online_state import Journal
from infra.online_state.rocks import RocksStateStore

store = RocksStateStore(Path(sys.argv[1]))
for i in range(1_000_000):
    journal = Journal(accounts={"a": {"n": i + 1, "sum": float(i + 1), "terms": [], "seq": i + 1}},
                      account_rows=[("a", i, [i, 1.0, None, None, [0.0], f"t{i}"])],
                      terminal_rows=[("x", [i, None, f"t{i}", i])],
                      owners=[(f"t{i}", f"h{i % 7}", i)], owners_kept_ns=100)
    with store.exclusive():
        store.commit(journal)
    print(i + 1, flush=True)
"""


def test_a_killed_writer_loses_no_committed_update_and_a_second_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None
        reported = 0
        while reported < 300:
            reported = int(child.stdout.readline())
        with pytest.raises(RuntimeError, match="open in another process.*INDUSFLOW_SERVE_REDIS_URL"):
            RocksStateStore(path)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        reported = max([reported, *(int(line) for line in child.stdout.read().split())])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    store = RocksStateStore(path)
    try:
        with store.exclusive():
            account = store.read(ACCOUNT, ["a"])["a"]
            terminal = store.read(TERMINAL, ["x"])["x"]
        n = account["n"]
        assert n in (reported, reported + 1)  # the kill may land after a commit, before its line
        assert [r[0] for r in account["recent"]] == list(range(n))  # every committed row, nothing torn
        assert [r[3] for r in terminal["rows"]] == list(range(n))
        assert store._opened is not None and store._opened.generation == n
        # every committed transaction's owner inside the retention (the newest claim's time - 100), and
        # no other: none lost, none orphaned (claimed without its rows), none kept past its retention
        assert store.owners([f"t{j}" for j in range(n + 2)]) == {f"t{j}": f"h{j % 7}" for j in range(n - 101, n)}
    finally:
        store.close()


def test_store_objects_of_one_process_share_the_database_and_see_each_others_commits(tmp_path: Path) -> None:
    one, two = RocksStateStore(tmp_path / "s"), RocksStateStore(tmp_path / "s")
    try:
        with one.exclusive() as unchanged:
            assert unchanged is False  # nothing known yet
            one.commit(Journal(terminal_rows=[("x", [t, None, f"t{rid}", rid])
                                              for rid, t in enumerate([5, 3, 9, 3, -2])]))
        with one.exclusive() as unchanged:
            assert unchanged is True  # its own commit was the last
        with two.exclusive():
            # time order, equal times in arrival order; with a limit, the newest
            assert [r[3] for r in two.read(TERMINAL, ["x"])["x"]["rows"]] == [4, 1, 3, 0, 2]
            assert [r[3] for r in two.read(TERMINAL, ["x"], limit=2)["x"]["rows"]] == [0, 2]
            two.commit(Journal(dropped=[("x", (3, None, "t1", 1))]))
        with one.exclusive() as unchanged:
            assert unchanged is False  # the other store object committed meanwhile
        assert two.reset(ACCOUNT, "nobody") is False
        with two.exclusive() as unchanged:
            assert unchanged is True  # a reset that found nothing moved nothing
        assert one.reset(TERMINAL, "x") is True
        with two.exclusive() as unchanged:
            assert unchanged is False and two.read(TERMINAL, ["x"]) == {}
    finally:
        one.close()
        two.close()
    reopened = RocksStateStore(tmp_path / "s")  # the last close released the folder
    reopened.close()
