"""A seeded synthetic fleet in long format: the embedded default data.

Every asset runs in three operating regimes (load/speed set points switching every few
hours), carries slow sensors (temperature, pressure every 2 h, flow, current) and two
fast vibration channels (``fast_rate`` samples per hour), and degrades toward failure
along one of three modes (thermal, hydraulic, bearing), each visible on a different mix
of sensors. Degradation starts at a random point, grows at an asset-specific rate and
severity, and sits under regime changes, per-asset calibration offsets, noise, dropped
readings and a few corrupted ones, so RUL is not readable from any single sensor.
Some assets are censored: observed up to a cut before failure, with no event.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solutions.sensor import schema as S
from solutions.sensor.config import SyntheticFleetConfig

MODES = ("thermal", "hydraulic", "bearing")
REGIMES = ((0.3, 1200.0), (0.6, 1800.0), (0.9, 2400.0))  # (load, speed rpm)
STEP_S = 3600.0
START = np.datetime64("2024-01-01T00:00:00", "ns")


def _asset(rng: np.random.Generator, cfg: SyntheticFleetConfig, name: str) -> tuple[list[pd.DataFrame], dict | None]:
    life = int(rng.integers(cfg.min_life, cfg.max_life + 1))
    censored = rng.random() < cfg.censored_fraction
    n = int(life * rng.uniform(0.35, 0.9)) if censored else life
    mode = int(rng.integers(len(MODES)))
    onset = life * rng.uniform(0.2, 0.6)
    severity = rng.uniform(0.7, 1.3)
    power = rng.uniform(1.3, 2.5)
    s = np.arange(n, dtype="float64")
    h = np.clip((s - onset) / (life - onset), 0, None) ** power * severity
    h += rng.normal(0, 0.02, n).cumsum() * 0.1 * (s > onset)  # wandering degradation path
    h = np.clip(h, 0, None)
    hm = np.zeros((3, n))
    hm[mode] = h
    hm[(mode + 1) % 3] = 0.25 * h * rng.uniform(0, 1)  # a weaker secondary symptom
    # regimes: piecewise constant, segments of 3-20 steps
    regime = np.empty(n, dtype=np.int64)
    i = 0
    while i < n:
        seg = int(rng.integers(3, 21))
        regime[i : i + seg] = rng.integers(len(REGIMES))
        i += seg
    load = np.array([REGIMES[r][0] for r in regime]) + rng.normal(0, 0.01, n)
    speed = np.array([REGIMES[r][1] for r in regime]) + rng.normal(0, 5, n)
    off = rng.normal(0, 1, 6)  # per-asset calibration offsets
    k = cfg.noise
    t0 = START + np.timedelta64(int(rng.integers(0, 90 * 24)), "h")
    therm, hyd, bear = hm
    slow = {
        "op_load": (load, 1),
        "op_speed": (speed, 1),
        "temperature": (60 + 40 * load + 0.01 * speed + 1.5 * off[0] + 9 * therm + 3 * bear + rng.normal(0, 1.5 * k, n), 1),
        "pressure": (5 + 3 * load - 1.2 * hyd + 0.2 * off[1] + rng.normal(0, 0.25 * k, n), 2),
        "flow": (100 + 50 * load - 14 * hyd - 3 * therm + 3 * off[2] + rng.normal(0, 3 * k, n), 1),
        "current": (10 + 8 * load + 0.002 * speed + 2 * therm + 1.2 * bear + 0.4 * off[3] + rng.normal(0, 0.6 * k, n), 1),
    }
    frames = []
    for sensor, (values, every) in slow.items():
        idx = np.arange(0, n, every)
        keep = rng.random(len(idx)) > (0.0 if sensor.startswith("op_") else 0.03)  # dropped readings
        idx = idx[keep]
        jitter = rng.uniform(0, 600, len(idx))
        frames.append(pd.DataFrame({
            S.ASSET: name, "_t": idx * STEP_S + jitter, S.SENSOR: sensor, S.VALUE: values[idx],
        }))
    r = cfg.fast_rate
    ss = np.repeat(np.arange(n), r)
    phase = rng.uniform(0, 2 * np.pi)
    tt = ss * STEP_S + (np.tile(np.arange(r), n) + rng.uniform(0, 0.5, n * r)) * (STEP_S / r)
    for sensor, amp_base, sym, imp in (("vib_radial", 0.5, bear, 0.25), ("vib_axial", 0.3, hyd, 0.05)):
        amp = amp_base * (0.6 + 0.4 * speed / 2400) * (1 + 0.1 * off[4]) + 1.2 * sym
        a = amp[ss]
        x = a * np.sin(2 * np.pi * (tt / 97.0) + phase) + rng.normal(0, 0.25 * k, n * r) * (1 + 0.5 * sym[ss])
        spikes = rng.random(n * r) < (0.01 + imp * sym[ss])
        x = x + spikes * rng.choice([-1, 1], n * r) * 3 * a
        frames.append(pd.DataFrame({S.ASSET: name, "_t": tt, S.SENSOR: sensor, S.VALUE: x}))
    out = []
    for f in frames:
        f[S.TIMESTAMP] = t0 + (f.pop("_t").to_numpy() * 1e9).astype("timedelta64[ns]")
        out.append(f)
    event = None if censored else {
        S.ASSET: name, S.FAILURE_TIME: t0 + np.timedelta64(int(life * STEP_S), "s"), S.FAILURE_TYPE: MODES[mode],
    }
    return out, event


def generate_fleet(cfg: SyntheticFleetConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(readings, events): long-format readings of every asset and one failure event per
    failed asset. Same config, same data."""
    rng = np.random.default_rng(cfg.seed)
    frames, events = [], []
    width = max(3, len(str(cfg.n_assets)))
    for i in range(cfg.n_assets):
        parts, event = _asset(rng, cfg, f"M{i + 1:0{width}d}")
        frames += parts
        if event:
            events.append(event)
    readings = pd.concat(frames, ignore_index=True)[[S.ASSET, S.TIMESTAMP, S.SENSOR, S.VALUE]]
    # corrupt a few readings: NaN, inf and out-of-range spikes, and duplicate a few rows
    n_bad = int(cfg.bad_reading_rate * len(readings))
    if n_bad:
        rows = rng.choice(len(readings), size=n_bad, replace=False)
        kinds = rng.integers(0, 3, n_bad)
        vals = readings[S.VALUE].to_numpy().copy()
        vals[rows[kinds == 0]] = np.nan
        vals[rows[kinds == 1]] = np.inf
        vals[rows[kinds == 2]] = 1e9
        readings[S.VALUE] = vals
        dup = readings.iloc[rng.choice(len(readings), size=max(1, n_bad // 4), replace=False)]
        readings = pd.concat([readings, dup], ignore_index=True)
    readings = readings.sort_values([S.ASSET, S.TIMESTAMP], kind="stable").reset_index(drop=True)
    readings[S.SENSOR] = readings[S.SENSOR].astype("string")
    events_df = pd.DataFrame(events, columns=list(S.EVENT_COLUMNS))
    return readings, events_df
