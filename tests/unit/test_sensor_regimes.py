"""Per-regime normalisation on a synthetic six-regime subset written in the C-MAPSS format
(as FD002/FD004 fly six operating conditions), and FD001 staying one regime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from solutions.sensor import schema as S
from solutions.sensor.cmapss import SENSOR_COLUMNS, load_cmapss
from solutions.sensor.config import SensorConfig, SensorSource
from solutions.sensor.data import window_config
from solutions.sensor.features import RegimeNormalizer

FD001 = Path(__file__).resolve().parents[3] / "shared" / "data" / "cmapss" / "train_FD001.txt"
#: the six flight conditions of FD002/FD004: altitude (kft), Mach number, throttle resolver angle
CONDITIONS = np.array([[0, 0.0, 100], [10, 0.25, 100], [20, 0.70, 100], [25, 0.62, 60], [35, 0.84, 100], [42, 0.84, 100]])


def write_six_regime_subset(folder: Path, subset: str = "FD002", units: int = 4, seed: int = 0) -> np.ndarray:
    """``train_<subset>.txt`` in the NASA format: every cycle flies one of the six conditions,
    each condition shifts every sensor by its own large offset, and wear adds a slow drift.
    Returns each sensor's per-condition offsets (6 x 21)."""
    rng = np.random.default_rng(seed)
    offsets = rng.normal(0, 50, size=(len(CONDITIONS), len(SENSOR_COLUMNS))) + 500
    lines = []
    for unit in range(1, units + 1):
        life = int(rng.integers(120, 160))
        for cycle in range(1, life + 1):
            regime = int(rng.integers(0, len(CONDITIONS)))
            ops = CONDITIONS[regime] + rng.normal(0, [0.003, 0.0003, 0.0], size=3)
            wear = (cycle / life) ** 2
            sensors = offsets[regime] + 2.0 * wear + rng.normal(0, 0.3, size=len(SENSOR_COLUMNS))
            fields = [str(unit), str(cycle), *(f"{v:.4f}" for v in ops), *(f"{v:.4f}" for v in sensors)]
            lines.append(" ".join(fields) + "  \n")
    (folder / f"train_{subset}.txt").write_text("".join(lines))
    return offsets


def _between_regime_spread(values: np.ndarray, regime: np.ndarray) -> float:
    """Largest spread (max - min) of the per-regime means over all channels."""
    means = np.stack([values[regime == r].mean(axis=0) for r in np.unique(regime)])
    return float((means.max(axis=0) - means.min(axis=0)).max())


def test_per_regime_normalisation_removes_the_six_regime_offsets(tmp_path: Path) -> None:
    offsets = write_six_regime_subset(tmp_path)
    grid, report = load_cmapss(tmp_path, "FD002")  # the train file alone: held-out engines come from it
    assert report.bad_total() == 0 and set(grid[S.SET]) == {"train"}
    wcfg = window_config(SensorSource(cmapss_dir=str(tmp_path), subset="FD002"), SensorConfig())
    assert wcfg.n_regimes == 6
    for n_regimes in (wcfg.n_regimes, "auto"):  # the subset's known count, and found from the settings
        norm = RegimeNormalizer(n_regimes, op_prefix="op_").fit(grid)
        assert len(norm.centers_) == 6
        regime = norm.regimes(grid)
        x = norm.transform(grid)
        raw = grid[norm.values_].to_numpy()
        # the regimes found are the flight conditions written (one cluster per condition)
        truth = np.argmin(np.abs(grid["op_setting_1"].to_numpy()[:, None] - CONDITIONS[None, :, 0]), axis=1)
        assert len({(a, b) for a, b in zip(regime, truth)}) == 6
        assert _between_regime_spread(raw, regime) > 100  # offsets of tens of units before
        assert _between_regime_spread(x, regime) < 0.05  # gone after: each regime centred
        # what is left is the wear signal: normalised sensors rise with the cycles run
        wear = 1.0 - grid[S.RUL].to_numpy() / grid.groupby(S.ASSET)[S.RUL].transform("max").to_numpy()
        assert np.corrcoef(x[:, 0], wear)[0, 1] > 0.5
    assert offsets.shape == (6, 21)
    # one global z-score leaves the offsets in: the regimes dominate the signal
    flat = RegimeNormalizer(1, op_prefix="op_").fit(grid).transform(grid)
    assert _between_regime_spread(flat, regime) > 1.0


@pytest.mark.skipif(not FD001.is_file(), reason="the real C-MAPSS FD001 training file is not in shared/data")
def test_fd001_stays_one_regime(tmp_path: Path) -> None:
    head = [line for line in FD001.read_text().splitlines(keepends=True) if int(line.split()[0]) <= 5]
    (tmp_path / "train_FD001.txt").write_text("".join(head))
    grid, _ = load_cmapss(tmp_path, "FD001")
    assert RegimeNormalizer("auto", op_prefix="op_").fit(grid).centers_.shape[0] == 1  # found, not told
    wcfg = window_config(SensorSource(cmapss_dir=str(tmp_path), subset="FD001"), SensorConfig())
    norm = RegimeNormalizer(wcfg.n_regimes, op_prefix="op_").fit(grid)
    assert wcfg.n_regimes == 1 and len(norm.centers_) == 1
    # constant sensors dropped (1, 5, 10, 16, 18, 19 never change; 6 takes two values), the 14 usual ones kept
    assert norm.values_ == [f"sensor_{i}" for i in (2, 3, 4, 7, 8, 9, 11, 12, 13, 14, 15, 17, 20, 21)]
