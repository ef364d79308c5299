"""What an online state store holds and the one protocol every store implements.

Two kinds of keyed state, both stored one row per event:

* ``ACCOUNT``: a small summary document (``n``, ``sum``, ``terms``, ``seq``: the sequence number
  the next row gets) and the key's recent rows, each under its sequence number (append-only; the
  oldest are cut from a sequence number on);
* ``TERMINAL``: the key's rows ``(t_ns, label, id, row id)`` in time order (equal times in arrival
  order); a row's label can be corrected, and rows leave by their row id.

Beside them, per transaction id, its owner (an opaque string: the server keeps a keyed hash of the
account it was scored under), claimed in the same commit as the transaction's rows and kept for
a bounded time after the transaction's (``Journal.owners_kept_ns``).

The domain (``solutions.fraud.online``) decides what the rows mean; a store only keeps them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "ACCOUNT",
    "TERMINAL",
    "AccountRow",
    "Journal",
    "OnlineStateStore",
    "StateConflict",
    "TerminalRow",
    "account_doc",
    "account_row",
    "owners_horizon",
    "terminal_doc",
]

ACCOUNT = "account"
TERMINAL = "terminal"


class StateConflict(RuntimeError):
    """Another writer committed to the shared store while an update ran without its lock (the lock
    expired); nothing of the update was written, and it can be computed again on the new state."""


# Rows in memory are tuples, never lists: the cyclic GC stops tracking a tuple of numbers and
# strings after its first pass, but walks every list on each full collection. With the rows of
# ~100k cached transactions as lists, full collections paused a serving process for 320-360 ms
# (14-25 per bench run; see also flows.serve.app.GC_THRESHOLDS); a label that arrives replaces its row's tuple.
#: (t_ns, amount, channel, category, step features, transaction id[, score, version]): the score and
#: the version that computed it once the row was scored
AccountRow = tuple[Any, ...]
TerminalRow = tuple[int, float | None, str | None, int]  #: (t_ns, label, transaction id, row id)


@dataclass
class Journal:
    """What one update changed, for the store to persist in one transaction (batched writes).

    Accounts: their summary (``n``, ``sum``, ``terms``, ``seq``) and their new rows, each under its
    sequence number; rows below ``account_cut[a]`` are gone. Terminals: one stored row per
    transaction (terminal, (time, label, id, row id)); new rows, label corrections (the whole row
    again) and the rows dropped from the windows. Owners: the transaction ids claimed, each with its
    owner and its time; a store keeps an owner ``owners_kept_ns`` after its transaction's time
    (None: for ever), then forgets it (:func:`owners_horizon`).
    """

    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)
    account_rows: list[tuple[str, int, Sequence[Any]]] = field(default_factory=list)
    account_cut: dict[str, int] = field(default_factory=dict)
    terminal_rows: list[tuple[str, Sequence[Any]]] = field(default_factory=list)
    labels: list[tuple[str, Sequence[Any]]] = field(default_factory=list)
    dropped: list[tuple[str, Sequence[Any]]] = field(default_factory=list)
    owners: list[tuple[str, str, int]] = field(default_factory=list)  #: (transaction id, owner, t_ns)
    owners_kept_ns: int | None = None

    def __bool__(self) -> bool:
        return bool(self.accounts or self.account_rows or self.terminal_rows or self.labels or self.dropped
                    or self.owners)


class OnlineStateStore(Protocol):
    """Accounts and terminals, stored one row per transaction, with an exclusive section.

    ``read`` and ``commit`` are called only inside ``exclusive()``; the section commits on a
    normal exit and discards the writes when it exits with an exception.
    """

    def exclusive(self) -> Any:
        """A context manager: no other writer (thread, process, replica) runs inside it. It yields
        True when no other writer committed since this store's own last commit (so what the
        caller kept in memory from before is still the stored state), else False."""

    def read(self, kind: str, keys: Sequence[str], limit: int | None = None) -> dict[str, dict[str, Any]]:
        """The state of ``keys`` (absent keys are left out): an account as
        ``{"n", "sum", "terms", "seq", "recent": [row, ...]}``, a terminal as ``{"rows": [row, ...]}``
        (rows in time order; with ``limit``, at most its newest ``limit``)."""

    def commit(self, journal: Journal) -> None:
        """Persist an update's changes (its owners in the same atomic write)."""

    def owners(self, ids: Sequence[str]) -> dict[str, str]:
        """The owner of each of ``ids`` that one holds (callable outside ``exclusive()`` too)."""

    def reset(self, kind: str, key: str) -> bool:
        """Forget one account's or terminal's state; False when there was none."""

    def close(self) -> None:
        """Release connections."""


def owners_horizon(journal: Journal) -> int | None:
    """Owners of transactions dated before this (ns) are forgotten on committing ``journal``: its
    newest claim's time less ``owners_kept_ns`` (None: nothing is forgotten)."""
    if journal.owners_kept_ns is None or not journal.owners:
        return None
    return max(t for _, _, t in journal.owners) - journal.owners_kept_ns


def account_row(stored: Sequence[Any]) -> AccountRow:
    """A stored account row (a JSON array) as the tuple kept in memory."""
    return (*stored[:4], tuple(stored[4]), *stored[5:])


def account_doc(summary: dict[str, Any], rows: list[AccountRow]) -> dict[str, Any]:
    """An account's document as :meth:`OnlineStateStore.read` gives it."""
    return {"n": summary["n"], "sum": summary["sum"], "terms": summary["terms"], "seq": summary["seq"],
            "recent": rows}


def terminal_doc(rows: list[TerminalRow]) -> dict[str, Any]:
    """A terminal's document: its rows sorted in time order, equal times in arrival order."""
    rows.sort(key=lambda r: (r[0], r[3]))
    return {"rows": rows}
