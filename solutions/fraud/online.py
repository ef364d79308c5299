"""Online scoring of the fraud vertical: score new transactions exactly as the batch path would have
scored them inside a file holding everything seen before them.

A request's rows are validated (:mod:`solutions.fraud.request_rows`), applied to the online state
(:mod:`solutions.fraud.online_state`: what it keeps and how an update computes the rows' inputs with
the one feature definition, :mod:`solutions.fraud.online_features`) and scored by a loaded version
(:mod:`solutions.fraud.online_model`); labels that arrive later go to the state
(:mod:`solutions.fraud.online_labels`). This module runs a batch of requests through those steps
atomically per request, and names what the serving layer uses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from infra.online_state import ACCOUNT, TERMINAL, StateConflict
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.online_labels import apply_labels
from solutions.fraud.online_model import OnlineFraudModel, RowInputs
from solutions.fraud.online_state import DamagedState, OnlineFraudState, OrderError
from solutions.fraud.request_rows import MAX_ID_CHARS, Rows, check_values, validate_rows

__all__ = [
    "ACCOUNT",
    "MAX_ID_CHARS",
    "TERMINAL",
    "DamagedState",
    "OnlineFraudModel",
    "OnlineFraudState",
    "OrderError",
    "RowInputs",
    "Rows",
    "ScoredRequest",
    "apply_labels",
    "challenger_fits",
    "check_values",
    "score_requests",
    "score_requests_with_inputs",
    "validate_rows",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoredRequest:
    """One request scored by :func:`score_requests_with_inputs`: the model's scores (row order), the
    rows' inputs (what a second version, a challenger, scores without touching the state again),
    the rows' account ids and transaction ids (canonical strings). ``versions`` is set for a request
    sent again (every row already applied): nothing was applied, ``scores`` are the stored ones,
    ``versions`` the versions that computed them, and there are no inputs."""

    scores: np.ndarray
    inputs: list[RowInputs]
    accounts: list[str]
    ids: list[str | None]
    has_terminal: bool
    versions: list[int] | None = None


#: Times an update overtaken by another writer (:class:`StateConflict`) is computed before it fails.
_CONFLICT_ATTEMPTS = 3


def score_requests(model: OnlineFraudModel, state: OnlineFraudState,
                   requests: Sequence[Sequence[Mapping[str, Any]]],
                   columns: Mapping[str, str] | None = None, *,
                   max_time_ns: int | None = None) -> list[np.ndarray | Exception]:
    """Per request, its scores (float64, row order) or the error that refused it: see
    :func:`score_requests_with_inputs`."""
    return [r if isinstance(r, Exception) else r.scores
            for r in score_requests_with_inputs(model, state, requests, columns, max_time_ns=max_time_ns)]


def challenger_fits(champion: OnlineFraudModel, challenger: OnlineFraudModel) -> str | None:
    """Why ``challenger`` cannot score the inputs computed for ``champion`` (None: it can). Inputs
    are computed once, with the champion's label delay and windows: a challenger trained with another
    delay or other windows would need its own window features."""
    if challenger.delay_days != champion.delay_days:
        return (f"{challenger.name}:{challenger.version} uses a label delay of {challenger.delay_days} days, the "
                f"champion {champion.delay_days}: its terminal windows differ, so it is not scored")
    if challenger.windows_days != champion.windows_days:
        return (f"{challenger.name}:{challenger.version} was trained with windows {challenger.windows_days} days, the "
                f"champion {champion.windows_days}: its window features differ, so it is not scored")
    return None


def score_requests_with_inputs(model: OnlineFraudModel, state: OnlineFraudState,
                               requests: Sequence[Sequence[Mapping[str, Any]]],
                               columns: Mapping[str, str] | None = None, *,
                               max_time_ns: int | None = None, keep: int | None = None,
                               max_amount: float = P.MAX_AMOUNT,
                               owners: Sequence[Sequence[str | None]] | None = None,
                               ) -> list[ScoredRequest | Exception]:
    """Score several requests' rows in order with one model call.

    Each request is validated on its own (what it is refused for, or scored as, never depends
    on the other requests of the batch): its rows by the one validator (:func:`validate_rows`:
    the batch path's rules, ids and categories included), its timestamps against
    ``max_time_ns``, and whether it gives the terminal windows the model needs. Each request
    is then applied atomically: one whose rows break the time order of an account gets an
    :class:`OrderError` and leaves the state as it was. A request whose every row was already
    applied and scored (a client's retry after a lost answer, on any replica) is answered with the
    stored scores (:attr:`ScoredRequest.versions` set) and applies nothing; each applied row is
    stored with its score and the model's version. If the model call fails, nothing is
    committed. An update overtaken by another writer of a shared store (:class:`StateConflict`:
    nothing of it was written) is computed again on the new state.

    With ``owners``, a transaction id names one transaction: a request with an id already scored
    under another owner gets an :class:`OrderError`, and each applied row's id is claimed for its
    owner in the same commit as the row (:meth:`~solutions.fraud.online_state._Batch.claim`).

    Args:
        model: the version that scores.
        state: the online state.
        requests: per request, its rows (source column names).
        columns: the column mapping canonical -> source.
        max_time_ns: latest timestamp accepted (ns since the epoch of naive timestamps; the server clock plus
            the allowed skew). A transaction dated in the future would otherwise become its
            account's latest and make every later real transaction of it "older". None: no bound.
        keep: steps per row kept in the inputs (default the model's ``seq_len``; more for a
            challenger with a longer sequence).
        max_amount: the largest amount accepted (a request with a larger one gets a
            :class:`DataValidationError`).
        owners: per request, per row, who the row's transaction id belongs to (the server passes a
            keyed hash of its account; None: the row claims nothing). None: nothing is claimed.

    Returns:
        Per request: its :class:`ScoredRequest` or the error that refused it.
    """
    if model.seq_len - 1 > state.history_len:
        raise ValueError(f"the model's seq_len {model.seq_len} needs more history than the state keeps "
                         f"({state.history_len} rows per account)")
    frames: list[Rows | Exception] = []
    for rows in requests:
        try:
            frame = validate_rows(rows, columns, max_amount=max_amount)
        except (DataValidationError, ValueError) as exc:
            frames.append(exc)
            continue
        if max_time_ns is not None:
            ahead = [i for i, t in enumerate(frame.t_ns) if t > max_time_ns]
            if ahead:
                frames.append(DataValidationError(
                    f"timestamp(s) in the future: after {pd.Timestamp(max_time_ns)}, the server clock plus the "
                    "allowed skew",
                    source="request", column=S.TIMESTAMP, rows=ahead[:5]))
                continue
        if model.needs_terminal and not frame.has_terminal:
            frames.append(DataValidationError(
                "the model needs the terminal windows (term_nb_tx_*, term_risk_*), which rows without "
                f"a {S.TERMINAL_ID!r} column cannot give", source="request", column=S.TERMINAL_ID))
            continue
        frames.append(frame)
    steps = max(model.seq_len, int(keep or 0))
    if steps - 1 > state.history_len:
        raise ValueError(f"{steps} steps per row need more history than the state keeps "
                         f"({state.history_len} rows per account)")
    for attempt in range(_CONFLICT_ATTEMPTS):
        results: list[Rows | ScoredRequest | Exception] = list(frames)
        spans = [(0, 0)] * len(frames)
        inputs: list[RowInputs] = []
        try:
            with state.update() as batch:
                group = _Group()
                for k, frame in enumerate(frames):
                    if isinstance(frame, Exception):
                        continue
                    if not group.joins(frame):
                        group.apply(batch, model, steps, inputs, spans)  # its checks read what it changes
                    who = owners[k] if owners is not None else None
                    refused = _refusal(batch, frame, who)
                    if refused is not None:
                        results[k] = refused
                    else:
                        group.add(k, frame, who)
                group.apply(batch, model, steps, inputs, spans)
                scores = model.predict(inputs)
                batch.record_scores(scores.tolist(), model.version)
            break
        except StateConflict:  # nothing was written: computed again on the state as it is now
            if attempt == _CONFLICT_ATTEMPTS - 1:
                raise
            log.warning("online-state update overtaken by another writer; computed again")
    return [r if isinstance(r, (Exception, ScoredRequest)) else
            ScoredRequest(scores=scores[a:b], inputs=inputs[a:b], accounts=r.accounts, ids=r.tx_ids,
                          has_terminal=r.has_terminal)
            for r, (a, b) in zip(results, spans, strict=True)]


@dataclass
class _Group:
    """Accepted requests of one update not applied yet. They are applied together: one feature
    computation per run of rows in time order (:meth:`~solutions.fraud.online_state._Batch.apply`)
    instead of one per request, which costs a single-transaction request most of its time in a batch.
    Each still gets the inputs it would get applied alone after the ones before it (a run's features
    are computed from the state before it, its own earlier rows included). A request joins only while
    its accounts and transaction ids are not the group's: what may refuse it (the order of its
    accounts' rows, a replay, an id's owner) reads only those, so it is checked as if the group were
    applied."""

    members: list[tuple[int, Rows, Sequence[str | None] | None]] = field(default_factory=list)
    accounts: set[str] = field(default_factory=set)
    tx_ids: set[str] = field(default_factory=set)

    def joins(self, frame: Rows) -> bool:
        if not self.members:
            return True
        return (frame.has_terminal == self.members[0][1].has_terminal and self.accounts.isdisjoint(frame.accounts)
                and self.tx_ids.isdisjoint(tx for tx in frame.tx_ids if tx is not None))

    def add(self, k: int, frame: Rows, who: Sequence[str | None] | None) -> None:
        self.members.append((k, frame, who))
        self.accounts.update(frame.accounts)
        self.tx_ids.update(tx for tx in frame.tx_ids if tx is not None)

    def apply(self, batch: Any, model: OnlineFraudModel, steps: int, inputs: list[RowInputs],
              spans: list[tuple[int, int]]) -> None:
        """Apply the members' rows as one, add their inputs to ``inputs`` (each member's span in
        ``spans``) and claim their ids; the group is then empty."""
        if not self.members:
            return
        start = len(inputs)
        inputs += batch.apply(Rows.concat([f for _, f, _ in self.members]), model.delay_days, keep=steps,
                              windows_days=model.windows_days)
        for k, frame, who in self.members:
            if who is not None:
                batch.claim(frame, who, model.delay_days)
            spans[k] = (start, start + len(frame))
            start += len(frame)
        self.members.clear()
        self.accounts.clear()
        self.tx_ids.clear()


def _refusal(batch: Any, frame: Rows, who: Sequence[str | None] | None) -> OrderError | ScoredRequest | None:
    """Why ``frame`` is not applied (its accounts loaded): an id already scored under another owner, a
    replay (answered with the stored scores), or its rows' order; None: it is applied."""
    batch.load(frame.accounts, [])
    taken = batch.owner_conflict(frame, who) if who is not None else None
    if taken is not None:
        return OrderError(f"row {taken}: transaction {frame.tx_ids[taken]!r} was already scored under another "
                          "account; a transaction id names one transaction (send it under its own account, or "
                          "give this one its own id)")
    stored = batch.replayed(frame)
    if stored is not None:  # sent again: answered as the first time, nothing applied
        return ScoredRequest(scores=np.array([score for score, _ in stored], dtype=np.float64), inputs=[],
                             accounts=frame.accounts, ids=frame.tx_ids, has_terminal=frame.has_terminal,
                             versions=[version for _, version in stored])
    try:
        batch.check(frame)
    except OrderError as exc:
        return exc
    return None
