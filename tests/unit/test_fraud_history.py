"""The history a batch file is scored after (solutions.fraud.history)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from solutions.fraud import history as H


def _tx(ids: list[str], accounts: list[str], terminals: list[str], days: list[float]) -> pd.DataFrame:
    start = pd.Timestamp("2025-03-01")
    return pd.DataFrame({
        "transaction_id": ids, "account_id": accounts, "terminal_id": terminals,
        "timestamp": [start + pd.Timedelta(days=d) for d in days], "amount": [10.0] * len(ids),
    })


def test_history_is_all_of_the_accounts_past_and_the_terminals_windows(tmp_path: Path) -> None:
    past = _tx(["old-a", "old-t", "far-t", "other", "late", "same"],
               ["A", "X", "Y", "Z", "A", "A"], ["t9", "T", "T", "t8", "t9", "t9"],
               [0, 70, 10, 75, 120, 99])
    past.assign(label=[0, 1, 0, 0, 0, 0]).to_parquet(tmp_path / "train.parquet", index=False)
    file = _tx(["same", "new"], ["A", "B"], ["t1", "T"], [100, 100.5])
    hist = H.history_before(file, [tmp_path / "train.parquet", tmp_path / "absent"], delay_days=7)
    # A's transaction 100 days before stays (sequences, mean amount); terminal T's within 30 + 7
    # days stays, the one 90 days before does not; "late" is after the file's start; "same" is the
    # file's own transaction; "other" shares nothing with the file
    assert sorted(hist["transaction_id"]) == ["old-a", "old-t"]
    assert "label" in hist and hist.set_index("transaction_id")["label"].to_dict() == {"old-a": 0, "old-t": 1}
    joined, since = H.with_history(file, hist)
    assert since == file["timestamp"].min().isoformat() and list(joined["transaction_id"]) == ["old-a", "old-t", "same", "new"]
    assert H.with_history(file, hist.iloc[0:0]) == (file, None)


def test_scored_files_are_kept_for_the_next_and_pruned_after_keep_days(tmp_path: Path) -> None:
    root = tmp_path / "batch-history"
    H.record_scored(root, "first", _tx(["a1"], ["A"], ["T"], [0]).assign(label=[1]))
    assert "label" not in pd.read_parquet(root / "first.parquet")  # never a label from a scored file
    H.record_scored(root, "second", _tx(["a2"], ["A"], ["T"], [H.KEEP_DAYS - 1]))
    later = _tx(["a3"], ["A"], ["T"], [H.KEEP_DAYS])
    assert sorted(H.history_before(later, [root], delay_days=7)["transaction_id"]) == ["a1", "a2"]
    H.record_scored(root, "third", _tx(["a4"], ["A"], ["T"], [H.KEEP_DAYS + 2]))
    assert sorted(p.stem for p in root.glob("*.parquet")) == ["second", "third"]
