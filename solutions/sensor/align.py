"""Long-format readings -> one time grid per asset.

Each asset's readings are put on a grid of ``step_seconds`` steps starting at its first
reading. Fast sensors (sampled several times per step, e.g. vibration) become RMS, peak
and kurtosis per step; slow ones (temperature, pressure) take the step's mean and are
carried forward up to ``ffill_limit`` steps; every sensor gets a gap flag (1 where it had
no reading at that step). Bad readings are counted in a :class:`BadReadingReport`,
never dropped silently; structurally wrong input raises :class:`DataValidationError`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from infra.tables import content_error, describe_columns, detect_encoding, read_table
from solutions.sensor import schema as S
from solutions.sensor.config import AlignConfig
from solutions.sensor.schema import BadReadingReport, ColumnMapping

log = logging.getLogger(__name__)

#: above this share of non-numeric values the value column is taken as wrongly mapped
MAX_NON_NUMERIC_SHARE = 0.5


def apply_mapping(
    df: pd.DataFrame, mapping: ColumnMapping, required: tuple[str, ...], source: str
) -> pd.DataFrame:
    """Rename source columns to canonical names and check the required ones are there."""
    absent = [src for src in mapping.columns.values() if src not in df.columns]
    if absent:
        raise DataValidationError(
            f"the column mapping names {absent}, which the table does not have; it has {describe_columns(df.columns)}",
            source=source,
            column=absent[0],
        )
    df = df.rename(columns={src: canon for canon, src in mapping.columns.items()})
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataValidationError(
            f"missing required column(s) {missing}; it has {describe_columns(df.columns)}. "
            "Map them with --columns canonical=SOURCE,...",
            source=source,
            column=missing[0],
        )
    return df


def to_seconds(values: pd.Series, source: str, column: str) -> np.ndarray:
    """Timestamps (datetimes, ISO strings or numbers) as float seconds."""
    if pd.api.types.is_datetime64_any_dtype(values):
        ts = values
    elif pd.api.types.is_numeric_dtype(values):
        out = values.to_numpy(dtype="float64")
        bad = ~np.isfinite(out)
        if bad.any():
            raise DataValidationError(
                f"{int(bad.sum())} timestamps are missing or not finite",
                source=source, column=column, rows=np.flatnonzero(bad)[:5].tolist(),
            )
        return out
    else:
        ts = pd.to_datetime(values, errors="coerce", utc=True, format="mixed")
        bad = ts.isna().to_numpy()
        if bad.any():
            rows = np.flatnonzero(bad)[:5].tolist()
            raise DataValidationError(
                f"{int(bad.sum())} timestamps cannot be parsed (e.g. {values.iloc[rows[0]]!r}); "
                "use ISO 8601 datetimes or numbers (seconds)",
                source=source, column=column, rows=rows,
            )
    if ts.dt.tz is not None:
        ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    if ts.isna().any():
        bad = ts.isna().to_numpy()
        raise DataValidationError(
            f"{int(bad.sum())} timestamps are missing", source=source, column=column,
            rows=np.flatnonzero(bad)[:5].tolist(),
        )
    return ts.to_numpy(dtype="datetime64[ns]").astype("int64") / 1e9


def clean_readings(
    df: pd.DataFrame, cfg: AlignConfig, source: str = "readings"
) -> tuple[pd.DataFrame, BadReadingReport]:
    """Validate canonical long-format readings; return the usable ones and the counts.

    Returns a frame with ``asset_id`` (str), ``t`` (float seconds), ``sensor`` (str) and
    ``value`` (float), sorted by asset, sensor and time.
    """
    report = BadReadingReport(source=source, readings_in=len(df))
    missing = [c for c in S.READING_COLUMNS if c not in df.columns]
    if missing:
        raise DataValidationError(
            f"missing required column(s) {missing}; it has {describe_columns(df.columns)}",
            source=source, column=missing[0],
        )
    if len(df) == 0:
        raise DataValidationError("has no readings", source=source)
    raw = df[S.VALUE]
    if pd.api.types.is_numeric_dtype(raw):
        value = raw.to_numpy(dtype="float64")
        non_numeric = np.zeros(len(df), dtype=bool)
    else:
        coerced = pd.to_numeric(raw, errors="coerce")
        non_numeric = (coerced.isna() & raw.notna()).to_numpy()
        value = coerced.to_numpy(dtype="float64")
    if non_numeric.mean() > MAX_NON_NUMERIC_SHARE:
        rows = np.flatnonzero(non_numeric)[:5].tolist()
        raise DataValidationError(
            f"{non_numeric.mean():.0%} of the values are not numbers (e.g. {raw.iloc[rows[0]]!r}); "
            "is the right column mapped to 'value'?",
            source=source, column=S.VALUE, rows=rows,
        )
    t = to_seconds(df[S.TIMESTAMP], source, S.TIMESTAMP)
    a_codes, a_names = pd.factorize(df[S.ASSET], sort=True)
    s_codes, s_names = pd.factorize(df[S.SENSOR], sort=True)
    for codes, column, what in ((a_codes, S.ASSET, "asset id"), (s_codes, S.SENSOR, "sensor name")):
        if (codes < 0).any():
            bad = codes < 0
            raise DataValidationError(
                f"{int(bad.sum())} readings have no {what}", source=source, column=column,
                rows=np.flatnonzero(bad)[:5].tolist(),
            )
    a_names = np.asarray(a_names, dtype=object).astype(str)
    s_names = np.asarray(s_names, dtype=object).astype(str)
    report.non_numeric = int(non_numeric.sum())
    nan = np.isnan(value) & ~non_numeric
    inf = np.isinf(value)
    report.nan, report.inf = int(nan.sum()), int(inf.sum())
    finite = np.isfinite(value)
    lo, hi = _ranges(s_names, cfg)
    out_of_range = finite & ((value < lo[s_codes]) | (value > hi[s_codes]))
    report.out_of_range = int(out_of_range.sum())
    keep = finite & ~out_of_range
    a_codes, s_codes, t, value = a_codes[keep], s_codes[keep], t[keep], value[keep]
    # order: count readings that go back in time within their (asset, sensor), then sort
    pair = a_codes.astype(np.int64) * len(s_names) + s_codes
    same = pair[1:] == pair[:-1]
    report.out_of_order = int(np.sum(same & (t[1:] < t[:-1])))
    order = np.lexsort((t, pair))
    pair, t, value = pair[order], t[order], value[order]
    a_codes, s_codes = a_codes[order], s_codes[order]
    dup = np.zeros(len(t), dtype=bool)
    dup[1:] = (pair[1:] == pair[:-1]) & (t[1:] == t[:-1])
    report.duplicate_timestamps = int(dup.sum())
    ok = ~dup
    out = pd.DataFrame({
        S.ASSET: pd.Categorical.from_codes(a_codes[ok], categories=a_names),
        "t": t[ok],
        S.SENSOR: pd.Categorical.from_codes(s_codes[ok], categories=s_names),
        S.VALUE: value[ok],
    })
    report.readings_used = len(out)
    return out, report


def _ranges(sensors: np.ndarray, cfg: AlignConfig) -> tuple[np.ndarray, np.ndarray]:
    """Allowed [min, max] of each sensor name."""
    default = cfg.valid_range.get("*", (-np.inf, np.inf))
    lo = np.full(len(sensors), float(default[0]))
    hi = np.full(len(sensors), float(default[1]))
    for i, name in enumerate(sensors):
        if name in cfg.valid_range:
            lo[i], hi[i] = cfg.valid_range[name]
    return lo, hi


def clean_events(df: pd.DataFrame, source: str = "events") -> pd.DataFrame:
    """Validate an events table: one failure per asset (the first one is kept)."""
    missing = [c for c in (S.ASSET, S.FAILURE_TIME) if c not in df.columns]
    if missing:
        raise DataValidationError(
            f"missing required column(s) {missing}; it has {describe_columns(df.columns)}", source=source, column=missing[0]
        )
    out = pd.DataFrame({S.ASSET: df[S.ASSET].astype("string").to_numpy()})
    out["failure_t"] = to_seconds(df[S.FAILURE_TIME], source, S.FAILURE_TIME)
    out[S.FAILURE_TYPE] = df[S.FAILURE_TYPE].astype("string").fillna("unknown").to_numpy() if S.FAILURE_TYPE in df else "unknown"
    return out.sort_values("failure_t").drop_duplicates(S.ASSET, keep="first").reset_index(drop=True)


def _codes(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(integer codes, sorted names) of a categorical or string column."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        names = np.asarray(col.cat.categories, dtype=object).astype(str)
        order = np.argsort(names, kind="stable")
        rank = np.empty(len(names), dtype=np.int64)
        rank[order] = np.arange(len(names))
        return rank[col.cat.codes.to_numpy()], names[order]
    codes, names = pd.factorize(col, sort=True)
    return codes.astype(np.int64), np.asarray(names, dtype=object).astype(str)


def _fast_by_rate(a_code: np.ndarray, s_code: np.ndarray, s_names: np.ndarray, step: np.ndarray) -> list[str]:
    span = int(step.max() - step.min() + 1) if len(step) else 1
    n_a = int(a_code.max() + 1) if len(a_code) else 1
    key = (s_code * n_a + a_code) * span + (step - step.min())
    occupied = np.bincount(np.unique(key) // (n_a * span), minlength=len(s_names))
    total = np.bincount(s_code, minlength=len(s_names))
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = total / occupied
    return sorted(s_names[rate >= 2.0].tolist())


def align_readings(
    readings: pd.DataFrame,
    events: pd.DataFrame | None,
    cfg: AlignConfig,
    report: BadReadingReport | None = None,
) -> tuple[pd.DataFrame, BadReadingReport]:
    """Put cleaned readings (from :func:`clean_readings`) on one grid per asset.

    Args:
        readings: ``asset_id``, ``t`` (seconds), ``sensor``, ``value``.
        events: from :func:`clean_events`; assets without an event are censored.
        cfg: grid step, fast sensors, forward-fill limit.

    Returns:
        The grid table (``asset_id``, ``step``, features, ``gap__*`` flags, ``rul``,
        ``failed``, ``failure_type``, ``set``) and the updated report.
    """
    report = report or BadReadingReport(readings_in=len(readings), readings_used=len(readings))
    if readings.empty:
        raise DataValidationError("no usable readings left to align", source=report.source or None)
    a_code, assets = _codes(readings[S.ASSET])
    s_code, sensor_names = _codes(readings[S.SENSOR])
    t = readings["t"].to_numpy()
    t0 = np.full(len(assets), np.inf)
    np.minimum.at(t0, a_code, t)
    t0 = np.floor(t0 / cfg.step_seconds) * cfg.step_seconds  # grid anchored to whole steps
    step = np.floor((t - t0[a_code]) / cfg.step_seconds).astype(np.int64)
    fast = set(cfg.fast_sensors) if cfg.fast_sensors is not None else set(_fast_by_rate(a_code, s_code, sensor_names, step))

    # failures: truncate each failed asset's grid at its failure step
    fail_step = np.full(len(assets), -1, dtype=np.int64)
    fail_type = np.full(len(assets), "", dtype=object)
    if events is not None and len(events):
        pos = pd.Index(assets).get_indexer(events[S.ASSET].to_numpy(dtype=object).astype(str))
        known = pos >= 0
        report.events_for_unknown_assets = int((~known).sum())
        fs = np.floor((events["failure_t"].to_numpy()[known] - t0[pos[known]]) / cfg.step_seconds).astype(np.int64)
        fail_step[pos[known]] = np.maximum(fs, 0)
        fail_type[pos[known]] = events[S.FAILURE_TYPE].to_numpy()[known]
    has_fail = fail_step >= 0
    after = has_fail[a_code] & (step > fail_step[a_code])
    report.after_failure += int(after.sum())
    report.readings_used -= int(after.sum())  # counted as left out, so no longer used
    keep = ~after
    a_code, step, t, s_code = a_code[keep], step[keep], t[keep], s_code[keep]
    value = readings[S.VALUE].to_numpy(dtype="float64")[keep]

    n_steps = np.zeros(len(assets), dtype=np.int64)
    np.maximum.at(n_steps, a_code, step + 1)
    n_steps = np.where(has_fail, np.maximum(n_steps, fail_step + 1), n_steps)
    short = n_steps < 2
    report.short_assets = sorted(assets[short].tolist())
    report.readings_used -= int(short[a_code].sum())  # the readings of skipped assets are not used
    if short.all():
        raise DataValidationError(
            f"every asset has fewer than 2 grid steps of {cfg.step_seconds:g} s; "
            "is the step too long for this data, or the timestamps in the wrong unit?",
            source=report.source or None,
        )
    offset = np.concatenate([[0], np.cumsum(n_steps)])
    rows = offset[a_code] + step
    n_rows = int(offset[-1])

    present = np.bincount(s_code, minlength=len(sensor_names)) > 0
    sensors = [str(n) for n, p in zip(sensor_names, present) if p]
    slow = [s for s in sensors if s not in fast]
    fast_l = [s for s in sensors if s in fast]
    columns: dict[str, np.ndarray] = {}
    s_index = {str(n): i for i, n in enumerate(sensor_names)}
    # slow sensors: mean per step
    for name in slow:
        m = s_code == s_index[name]
        total = np.bincount(rows[m], weights=value[m], minlength=n_rows)
        count = np.bincount(rows[m], minlength=n_rows)
        with np.errstate(invalid="ignore", divide="ignore"):
            columns[name] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        columns[S.GAP_PREFIX + name] = (count == 0).astype("float32")
    # fast sensors: RMS, peak and kurtosis per step
    for name in fast_l:
        m = s_code == s_index[name]
        r, x = rows[m], value[m]
        n = np.bincount(r, minlength=n_rows).astype("float64")
        s1 = np.bincount(r, weights=x, minlength=n_rows)
        s2 = np.bincount(r, weights=x * x, minlength=n_rows)
        s3 = np.bincount(r, weights=x ** 3, minlength=n_rows)
        s4 = np.bincount(r, weights=x ** 4, minlength=n_rows)
        peak = np.zeros(n_rows)
        np.maximum.at(peak, r, np.abs(x))
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = s1 / n
            var = s2 / n - mu * mu
            m4 = s4 / n - 4 * mu * s3 / n + 6 * mu * mu * s2 / n - 3 * mu ** 4
            kurt = np.where((n >= 4) & (var > 1e-12), m4 / np.maximum(var, 1e-12) ** 2, np.nan)
            columns[f"{name}_rms"] = np.where(n > 0, np.sqrt(s2 / np.maximum(n, 1)), np.nan)
        columns[f"{name}_peak"] = np.where(n > 0, peak, np.nan)
        columns[f"{name}_kurtosis"] = kurt
        columns[S.GAP_PREFIX + name] = (n == 0).astype("float32")

    asset_col = np.repeat(assets, n_steps)
    step_col = np.arange(n_rows) - np.repeat(offset[:-1], n_steps)
    grid = pd.DataFrame({S.ASSET: asset_col, S.STEP: step_col.astype(np.int64)})
    value_cols = [c for c in columns if not c.startswith(S.GAP_PREFIX)]
    values = pd.DataFrame({c: columns[c] for c in value_cols})
    if cfg.ffill_limit > 0:
        values = values.groupby(grid[S.ASSET].to_numpy(), sort=False).ffill(limit=cfg.ffill_limit)
    grid = pd.concat([grid, values, pd.DataFrame({c: columns[c] for c in columns if c.startswith(S.GAP_PREFIX)})], axis=1)
    fs = np.repeat(fail_step, n_steps)
    grid[S.RUL] = np.where(fs >= 0, fs - step_col, np.nan).astype("float64")
    grid[S.FAILED] = np.repeat(has_fail, n_steps)
    grid[S.FAILURE_TYPE] = np.repeat(fail_type, n_steps).astype(str)
    grid[S.SET] = "fleet"
    grid = grid.loc[~np.repeat(short, n_steps)].reset_index(drop=True)
    log.info(
        "aligned %d readings of %d assets onto %d grid steps (%d fast, %d slow sensors)",
        len(value), len(assets) - int(short.sum()), len(grid), len(fast_l), len(slow),
    )
    return grid, report


def table_header(path: Path) -> list[str]:
    """The column names of a CSV or Parquet file, read without its rows."""
    source = str(path)
    if not path.is_file():
        raise DataValidationError("file not found", source=source)
    with open(path, "rb") as handle:
        magic = handle.read(4)
    try:
        if magic == b"PAR1":
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        return [str(c) for c in pd.read_csv(path, nrows=0, encoding=detect_encoding(path)).columns]
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError, ValueError) as exc:
        raise DataValidationError(f"cannot be read as a table: {content_error(exc)}", source=source) from exc


def check_table_columns(path: Path, mapping: ColumnMapping, kind: str = "readings") -> None:
    """Pre-flight: a readings (or events) file has the required columns under ``mapping``."""
    header = pd.DataFrame(columns=table_header(path))
    if kind == "events":
        event_map = ColumnMapping({k: v for k, v in mapping.columns.items() if k in S.EVENT_COLUMNS})
        apply_mapping(header, event_map, (S.ASSET, S.FAILURE_TIME), str(path))
    else:
        apply_mapping(header, mapping, S.READING_COLUMNS, str(path))


def load_readings(
    path: Path,
    mapping: ColumnMapping,
    cfg: AlignConfig,
    events_path: Path | None = None,
    encoding: str | None = None,
) -> tuple[pd.DataFrame, BadReadingReport]:
    """Read, map, clean and align a long-format readings file (plus an optional events file);
    CSV text in ``encoding``, or the detected one."""
    source = str(path)
    df = apply_mapping(read_table(path, encoding), mapping, S.READING_COLUMNS, source)
    readings, report = clean_readings(df, cfg, source)
    events = None
    if events_path is not None:
        event_map = ColumnMapping({k: v for k, v in mapping.columns.items() if k in S.EVENT_COLUMNS})
        raw = apply_mapping(read_table(events_path, encoding), event_map, (S.ASSET, S.FAILURE_TIME), str(events_path))
        events = clean_events(raw, str(events_path))
    return align_readings(readings, events, cfg, report)
