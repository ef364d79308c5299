"""The model side of online fraud scoring: a loaded version of any registered kind (sequence model,
GBM baseline or their ensemble) scoring the inputs the online state computed for new transactions
(:class:`RowInputs`), built exactly as the batch path builds its batches.

The network runs on ONNX Runtime where it can (:func:`onnx_runtime`): ``bench/model_path_bench.py``
measured it fastest at every batch size on the served GRU (issue 47: 7x eager's CPU time at 1 row,
1.3x at 256; probabilities within 5.8e-8 of eager's), and torch eager otherwise.
"""

from __future__ import annotations

import logging
import operator
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from infra.errors import DataValidationError
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.candidates import StoredBaseline
from solutions.fraud.feature_defs import static_features, windows_of
from solutions.fraud.sequences import STEP_NUMERIC, FraudPreprocessor, scale_features

__all__ = ["OnlineFraudModel", "RowInputs", "WindowRow", "onnx_runtime"]

log = logging.getLogger(__name__)

#: The network's inputs, in the order its ONNX graph takes them.
NET_INPUTS = ("step_num", "step_cat", "ctx_num", "ctx_cat")
#: Largest difference from eager's probabilities accepted of an exported graph (the skew budget
#: against batch scoring, which runs the network eagerly, is 1e-5).
ONNX_TOLERANCE = 1e-6
_told: set[str] = set()  # why a network runs eagerly, each reason logged once per process


def _eager_because(reason: str) -> None:
    if reason not in _told:
        _told.add(reason)
        log.warning("the fraud network runs in torch eager: %s", reason)


def example_batch(preprocessor: FraudPreprocessor, seq_len: int, rows: int = 8) -> dict[str, torch.Tensor]:
    """A batch of the network's input shapes, with random values and every category index in range
    (0: unknown, as :meth:`OnlineFraudModel.tensors` codes them)."""
    gen = torch.Generator().manual_seed(0)
    vocab = preprocessor.vocab_

    def codes(col: str, *shape: int) -> torch.Tensor:
        return torch.randint(0, len(vocab.get(col, [])) + 1, shape, generator=gen)

    return {
        "step_num": torch.randn(rows, seq_len, len(STEP_NUMERIC) + 1, generator=gen),
        "step_cat": torch.stack([codes(S.CHANNEL, rows, seq_len), codes(S.CATEGORY, rows, seq_len)], dim=-1),
        "ctx_num": torch.randn(rows, 2 + len(preprocessor.window_feature_names), generator=gen),
        "ctx_cat": codes(S.OCCUPATION, rows, 1),
    }


def onnx_runtime(net: torch.nn.Module, preprocessor: FraudPreprocessor, seq_len: int) -> Any | None:
    """An ONNX Runtime session running ``net`` (exported by :func:`infra.onnx.export_onnx`, dynamic
    batch axis; as many intra-op threads as torch has), or None where the network stays in torch
    eager, the reason logged once: onnxruntime is not installed, the network is not on the CPU, the
    export fails (a compressed variant's quantized layers), or the graph's probabilities differ from
    eager's by more than :data:`ONNX_TOLERANCE` on :func:`example_batch`. The graph lives only in
    the session: its file is deleted once loaded."""
    from infra.onnx import export_onnx, onnx_feed, onnx_session

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        _eager_because("onnxruntime is not installed (the compress extra)")
        return None
    if any(p.device.type != "cpu" for p in net.parameters()):
        _eager_because("the network is on a GPU (ONNX Runtime serves it on the CPU only)")
        return None
    example = example_batch(preprocessor, seq_len)
    try:
        with tempfile.TemporaryDirectory(prefix="fraud-onnx-") as tmp:
            path, names = export_onnx(net, example, Path(tmp) / "net.onnx", input_names=NET_INPUTS)
            session = onnx_session(path)
        got = _sigmoid(session.run(None, onnx_feed(example, names))[0])
    except Exception as exc:  # noqa: BLE001 - any export failure leaves the network in eager, said once
        _eager_because(f"its ONNX export failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        return None
    with torch.inference_mode():
        want = torch.sigmoid(net(example).float()).numpy().astype("float64")
    diff = float(np.max(np.abs(got - want)))
    if not diff <= ONNX_TOLERANCE:
        _eager_because(f"its ONNX graph's probabilities differ from eager's by {diff:.2g} (> {ONNX_TOLERANCE:g})")
        return None
    return session


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    """Probabilities (float64) of float32 logits, by the same kernel as eager's ``torch.sigmoid``."""
    return torch.sigmoid(torch.from_numpy(np.asarray(logits, dtype="float32"))).numpy().astype("float64")


class WindowRow(Mapping[str, float]):
    """One row's window features by name: its values beside the names (and their places) that every
    row of its run shares, so a row costs one small object (a dict per row cost ~1.2 ms per 256-row
    request), and the model reads a batch's features by place (:func:`window_matrix`)."""

    __slots__ = ("names", "numbers", "places")

    def __init__(self, names: tuple[str, ...], places: Mapping[str, int], numbers: Sequence[float]) -> None:
        self.names, self.places, self.numbers = names, places, numbers

    @classmethod
    def rows(cls, names: Sequence[str], matrix: np.ndarray) -> list[WindowRow]:
        """One per row of ``matrix`` (its columns: ``names``)."""
        shared = tuple(names)
        places = {name: j for j, name in enumerate(shared)}
        return [cls(shared, places, numbers) for numbers in matrix.tolist()]

    def __getitem__(self, name: str) -> float:
        return self.numbers[self.places[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def window_matrix(windows: Sequence[Mapping[str, float]], names: Sequence[str]) -> np.ndarray:
    """float64 ``[len(windows), len(names)]``: each row's features ``names``, read by place for
    :class:`WindowRow` (one C call per row), by name otherwise.

    Raises:
        KeyError: a row has no feature of one of ``names``.
    """
    by_name = operator.itemgetter(*names)
    by_place: dict[int, Any] = {}  # per shared places (one per run of rows): where ``names`` are
    out = []
    for w in windows:
        if type(w) is WindowRow:
            pick = by_place.get(id(w.places))
            if pick is None:
                pick = by_place[id(w.places)] = operator.itemgetter(*(w.places[name] for name in names))
            out.append(pick(w.numbers))
        else:
            out.append(by_name(w))
    return np.array(out, dtype="float64").reshape(len(windows), len(names))


@dataclass(slots=True)
class RowInputs:
    """What one transaction feeds the model, before the model's scaling.

    Attributes:
        steps: raw step features (float64 ``[rows, len(STEP_NUMERIC)]``) of the account's earlier rows
            and this one (oldest first; at most ``history_len + 1``).
        step_cats: (channel, category) strings of the same rows.
        window: window features by name (a :class:`WindowRow` from the online state).
        static: ``(age, account_age_days)`` raw (NaN when unknown).
        occupation: occupation string or None.
    """

    steps: np.ndarray
    step_cats: list[tuple[str | None, str | None]]
    window: Mapping[str, float]
    static: tuple[float, float]
    occupation: str | None



@dataclass(frozen=True)
class OnlineFraudModel:
    """A loaded fraud version of any registered kind, ready to score :class:`RowInputs`.

    A sequence-model version has a network, a GBM version a baseline, an ensemble both (its
    score is the mean of the two probabilities, as the batch path's
    :func:`~solutions.fraud.scoring.score_transactions` averages them).

    Attributes:
        net: the network (eval mode); None for a GBM version.
        preprocessor: its preprocessing (None without a network).
        seq_len: steps per sequence (1 without a network: no history is read).
        threshold: its decision threshold.
        delay_days: the label delay of its terminal windows.
        name: registry name. version: registry version.
        baseline: the version's GBM (:class:`~solutions.fraud.candidates.StoredBaseline`), if any.
        runtime: an ONNX Runtime session running ``net`` (:func:`onnx_runtime`); None: torch eager.
    """

    net: torch.nn.Module | None
    preprocessor: FraudPreprocessor | None
    seq_len: int
    threshold: float
    delay_days: int
    name: str
    version: int
    baseline: StoredBaseline | None = None
    runtime: Any = None

    @classmethod
    def from_registry(cls, net: torch.nn.Module | None, preprocessor: FraudPreprocessor | None, seq_len: int,
                      name: str, version: int, params: Mapping[str, Any],
                      baseline: StoredBaseline | None = None, onnx: bool = True) -> OnlineFraudModel:
        """From a registered version's parts (threshold and delay read from its params); the network
        runs on ONNX Runtime unless ``onnx`` is false or :func:`onnx_runtime` finds it cannot."""
        if net is None and baseline is None:
            raise ValueError(f"{name}:{version}: nothing to score with (no network and no baseline)")
        if net is not None and preprocessor is None:
            raise ValueError(f"{name}:{version}: a network needs its preprocessor")
        delay = float(params.get("split", {}).get("delay_days", 7))
        runtime = None
        if net is not None:
            net.eval()
            runtime = onnx_runtime(net, preprocessor, int(seq_len)) if onnx and preprocessor is not None else None
        return cls(net=net, preprocessor=preprocessor, seq_len=int(seq_len) if net is not None else 1,
                   threshold=float(params.get("threshold", 0.5)),
                   delay_days=P.window_transformer(delay).delay_days, name=name, version=int(version),
                   baseline=baseline, runtime=runtime)

    @property
    def recorded_features(self) -> list[str]:
        """The window and GBM feature names it was trained with (its network's, then its GBM's)."""
        names = list(self.preprocessor.window_feature_names) if self.preprocessor is not None else []
        return names + (list(self.baseline.feature_names) if self.baseline is not None else [])

    @property
    def needs_terminal(self) -> bool:
        """Whether its inputs include terminal windows (rows then need a ``terminal_id`` column)."""
        return any(name.startswith("term_") for name in self.recorded_features)

    @property
    def windows_days(self) -> tuple[int, ...]:
        """The window lengths it was trained with (read from :attr:`recorded_features`)."""
        return windows_of(self.recorded_features)

    @property
    def kind(self) -> str:
        """``sequence``, ``baseline`` or ``ensemble`` (the candidate names of a training run)."""
        if self.baseline is None:
            return "sequence"
        return "baseline" if self.net is None else "ensemble"

    def tensors(self, rows: Sequence[RowInputs]) -> dict[str, torch.Tensor]:
        """The model's batch for these rows, built like :class:`SequenceDataset` does.

        Vectorised over the rows: every row's steps are scaled in one :func:`scale_features`
        call (elementwise, so each value is what scaling the row alone gives).
        """
        pre = self.preprocessor
        assert pre is not None, "a GBM version has no sequence tensors"
        n, L = len(rows), self.seq_len
        n_num = len(STEP_NUMERIC)
        step_num = np.zeros((n, L, n_num + 1), dtype="float32")
        step_cat = np.zeros((n, L, 2), dtype="int64")
        lookups = self._lookups()
        chan_of, cat_of, occ = lookups[S.CHANNEL], lookups[S.CATEGORY], lookups[S.OCCUPATION]
        names = list(pre.window_feature_names)
        kept = [row.steps[-L:] for row in rows]
        lengths = np.fromiter(map(len, kept), dtype="int64", count=n)
        steps = np.concatenate(kept, dtype="float64") if kept else np.zeros((0, n_num))
        row_idx = np.repeat(np.arange(n), lengths)
        ends = np.cumsum(lengths)
        col_idx = np.arange(len(row_idx)) - np.repeat(ends - lengths, lengths) + np.repeat(L - lengths, lengths)
        step_num[row_idx, col_idx, :n_num] = scale_features(steps, pre.step_mean_, pre.step_std_).astype("float32")
        step_num[row_idx, col_idx, n_num] = 1.0
        cats = [c for row in rows for c in row.step_cats[-L:]]
        step_cat[row_idx, col_idx, 0] = [chan_of.get(c, 0) if c is not None else 0 for c, _ in cats]
        step_cat[row_idx, col_idx, 1] = [cat_of.get(c, 0) if c is not None else 0 for _, c in cats]
        raw = np.array([row.static for row in rows], dtype="float64").reshape(n, 2)
        static = static_features(raw[:, 0], raw[:, 1])
        ctx = np.zeros((n, 2 + len(names)), dtype="float64")
        ctx[:, :2] = scale_features(static, pre.static_mean_, pre.static_std_)
        if names:
            try:
                win = window_matrix([row.window for row in rows], names)
            except KeyError as exc:
                raise DataValidationError(
                    f"the model needs window feature {exc.args[0]!r}, which these rows cannot give "
                    "(is a column such as terminal_id missing?)", source="request",
                ) from exc
            ctx[:, 2:] = scale_features(win, pre.window_mean_, pre.window_std_)
        ctx_cat = np.array([[occ.get(row.occupation, 0) if row.occupation is not None else 0] for row in rows],
                           dtype="int64").reshape(n, 1)
        return {
            "step_num": torch.from_numpy(step_num),
            "step_cat": torch.from_numpy(step_cat),
            "ctx_num": torch.from_numpy(ctx.astype("float32")),
            "ctx_cat": torch.from_numpy(ctx_cat),
        }

    def _lookups(self) -> dict[str, dict[str, int]]:
        """Category -> index (0: unknown) of channel, category and occupation, built once per version."""
        cached = self.__dict__.get("_lookups_cache")
        if cached is None:
            vocab = self.preprocessor.vocab_
            cached = {col: {v: i + 1 for i, v in enumerate(vocab.get(col, []))}
                      for col in (S.CHANNEL, S.CATEGORY, S.OCCUPATION)}
            object.__setattr__(self, "_lookups_cache", cached)  # a frozen dataclass: a private cache
        return cached

    def baseline_frame(self, rows: Sequence[RowInputs]) -> pd.DataFrame:
        """The GBM's input rows: its feature columns, valued as :class:`WindowFeatures` values them.

        Window features come from the state; a one-hot column ``channel=v`` (``category=``,
        ``occupation=``) is 1 when the row's value is ``v``; ``age`` and ``account_age_days``
        are the raw values (NaN when unknown).

        Raises:
            DataValidationError: the GBM needs a window feature these rows cannot give.
        """
        assert self.baseline is not None
        names = self.baseline.feature_names
        getters: list[Any] = []
        for name in names:
            col, sep, value = name.partition("=")
            if sep and col in (S.CHANNEL, S.CATEGORY, S.OCCUPATION):
                getters.append((col, value))
            elif name in (S.AGE, S.ACCOUNT_AGE_DAYS):
                getters.append(name)
            else:
                getters.append(None)
        out = np.empty((len(rows), len(names)), dtype="float64")
        window_cols = [j for j, get in enumerate(getters) if get is None]
        if window_cols and rows:
            try:
                out[:, window_cols] = window_matrix([row.window for row in rows], [names[j] for j in window_cols])
            except KeyError as exc:
                raise DataValidationError(
                    f"the model needs window feature {exc.args[0]!r}, which these rows cannot give "
                    "(is a column such as terminal_id missing?)", source="request",
                ) from None
        for i, row in enumerate(rows):
            channel, category = row.step_cats[-1]
            current = {S.CHANNEL: channel, S.CATEGORY: category, S.OCCUPATION: row.occupation}
            for j, get in enumerate(getters):
                if type(get) is tuple:
                    out[i, j] = float(current[get[0]] == get[1])
                elif get is not None:
                    out[i, j] = row.static[0] if get == S.AGE else row.static[1]
        return pd.DataFrame(out, columns=list(names))

    def predict(self, rows: Sequence[RowInputs]) -> np.ndarray:
        """Fraud probabilities of ``rows`` (float64), one call per model part (the mean of an ensemble's)."""
        if not rows:
            return np.zeros(0)
        parts: list[np.ndarray] = []
        if self.net is not None:
            parts.append(self.network_probabilities(self.tensors(rows)))
        if self.baseline is not None:
            parts.append(np.asarray(self.baseline.probabilities(self.baseline_frame(rows)), dtype="float64"))
        return np.mean(parts, axis=0)

    def network_probabilities(self, batch: Mapping[str, torch.Tensor]) -> np.ndarray:
        """The network's probabilities (float64) of a batch from :meth:`tensors`, on its runtime."""
        assert self.net is not None
        if self.runtime is not None:
            return _sigmoid(self.runtime.run(None, {k: batch[k].numpy() for k in NET_INPUTS})[0])
        device = next(self.net.parameters()).device
        with torch.inference_mode():
            logits = self.net({k: v.to(device) for k, v in batch.items()})
        return torch.sigmoid(logits.float()).cpu().numpy().astype("float64")
