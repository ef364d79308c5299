"""Reading tabular files: CSV or Parquet, recognised by content, with named errors.

Shared by the generic load task and the verticals' own readers (``solutions`` may use
``infra``, not ``tasks``).
"""

from __future__ import annotations

import codecs
import datetime as dt
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, TypeVar

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from infra.errors import DataValidationError
from infra.store import atomic_path, stable_hash

T = TypeVar("T")

#: How much of a CSV the encoding detection looks at, and how many bytes of non-ASCII lines it weighs.
DETECT_SAMPLE_BYTES = 4 << 20
DETECT_TEXT_BYTES = 64 << 10
#: Among equally likely encodings, the first of these wins (Western European, then CJK).
PREFERRED_ENCODINGS = ("utf_8", "cp1252", "latin_1", "gb18030", "big5", "cp932", "cp949", "cp1251", "cp1250")


def detect_encoding(path: Path) -> str:
    """The text encoding of a CSV file: UTF-8 when its bytes decode as UTF-8, else the best
    guess of ``charset-normalizer`` over the lines that hold non-ASCII bytes.

    Raises :class:`DataValidationError` when no encoding fits (pass one explicitly then).
    """
    with open(path, "rb") as handle:
        sample = handle.read(DETECT_SAMPLE_BYTES)
    if sample.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if sample.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=False)  # a cut last character is fine
        return "utf-8"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    # the ASCII lines carry no evidence; the lines with other bytes do
    text = b"\n".join(line for line in sample.splitlines() if max(line, default=0) > 127)[:DETECT_TEXT_BYTES]
    matches = from_bytes(text)
    best = matches.best()
    if best is None:
        raise DataValidationError("cannot tell its text encoding; pass one explicitly (e.g. --encoding gbk)",
                                  source=str(path))
    # equally good readings (same bytes, same characters): take the most common encoding
    tied = {m.encoding for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence)}
    return next((e for e in PREFERRED_ENCODINGS if e in tied), best.encoding)


def check_encoding(encoding: str) -> str:
    """``encoding`` if Python knows it; else ``ValueError`` naming common ones."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(f"unknown text encoding {bounded(encoding, 40)!r} (e.g. utf-8, gbk, latin-1)") from None
    return encoding


def read_table(path: Path, encoding: str | None = None) -> pd.DataFrame:
    """Read a CSV or Parquet file, deciding by content (Parquet magic) then by suffix.

    A CSV is decoded with ``encoding``, or with the detected one (:func:`detect_encoding`).
    Errors of the content raise :class:`DataValidationError` with a bounded message that
    quotes no cell; errors of the machine (permission denied, disk, a lost mount: an
    ``OSError`` with an errno) propagate unchanged.
    """
    if not path.exists():
        raise DataValidationError("file not found", source=str(path))
    return _read_by_content(path, encoding, pd.read_parquet,
                            lambda p, enc: pd.read_csv(p, low_memory=False, encoding=enc))


def read_header(path: Path, encoding: str | None = None) -> list[str]:
    """The column names of a CSV or Parquet file, read without its rows (a Parquet schema,
    a CSV's first line), by the same content rules and errors as :func:`read_table`.

    Raises:
        DataValidationError: the file is missing, empty or cannot be read as a table.
    """
    if not path.is_file():
        raise DataValidationError("file not found", source=str(path))

    def parquet_names(p: Path) -> list[str]:
        import pyarrow.parquet as pq

        return [str(name) for name in pq.read_schema(p).names]

    return _read_by_content(path, encoding, parquet_names,
                            lambda p, enc: [str(c) for c in pd.read_csv(p, nrows=0, encoding=enc).columns])


def _read_by_content(path: Path, encoding: str | None, parquet: Callable[[Path], T],
                     csv: Callable[[Path, str], T]) -> T:
    """``parquet(path)`` when the content is Parquet, else ``csv(path, encoding)``; content
    errors as :class:`DataValidationError`, machine errors unchanged (see :func:`read_table`)."""
    if path.stat().st_size == 0:
        raise DataValidationError("file is empty (0 bytes)", source=str(path))
    with open(path, "rb") as handle:
        magic = handle.read(4)
    try:
        if magic == b"PAR1":
            return parquet(path)
        if path.suffix.lower() in {".parquet", ".pq"}:
            raise DataValidationError("file ends in .parquet but is not Parquet", source=str(path))
        if encoding:
            try:
                check_encoding(encoding)
            except ValueError as exc:
                raise DataValidationError(str(exc), source=str(path)) from None
        return csv(path, encoding or detect_encoding(path))
    except DataValidationError:
        raise
    except OSError as exc:
        if exc.errno is not None:  # the machine, not the file: let the caller retry
            raise
        raise DataValidationError(f"cannot be parsed: {content_error(exc)}", source=str(path)) from exc
    except pd.errors.EmptyDataError as exc:
        raise DataValidationError("file has no header and no rows", source=str(path)) from exc
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise DataValidationError(f"cannot be parsed: {content_error(exc)}", source=str(path)) from exc


def check_mapped_columns(path: Path, columns: Mapping[str, str], encoding: str | None = None) -> None:
    """Pre-flight: every source column of a canonical -> source mapping is in the file's header.

    Raises:
        DataValidationError: naming the file and the first absent column, with the file's columns.
    """
    if not columns:
        return
    header = read_header(path, encoding)
    absent = [src for src in columns.values() if src not in header]
    if absent:
        raise DataValidationError(
            f"column mapping names {absent}, which the file does not have; it has {describe_columns(header)}",
            source=str(path),
            column=absent[0],
        )


# --------------------------------------------------------------------------------------
# messages that quote no content

#: At most this many column names in a message, each cut to ``MAX_NAME_CHARS``.
MAX_COLUMNS_SHOWN = 12
MAX_NAME_CHARS = 32
_LONG_NUMBER = re.compile(r"\d[\d .\-]{4,}\d")
_EMAIL = re.compile(r"[^\s@,;]+@[^\s@,;]+")


def bounded(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters, with e-mail addresses and long digit
    runs (phone, card and ID numbers) masked."""
    text = _EMAIL.sub("<email>", str(text))
    text = _LONG_NUMBER.sub(lambda m: "#" * min(len(m.group()), 8), text)
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_columns(columns: Iterable[object]) -> str:
    """A bounded, redacted list of a file's column names for an error message."""
    names = [str(c) for c in columns]
    shown = [bounded(n, MAX_NAME_CHARS) for n in names[:MAX_COLUMNS_SHOWN]]
    more = f" and {len(names) - MAX_COLUMNS_SHOWN} more" if len(names) > MAX_COLUMNS_SHOWN else ""
    return "[" + ", ".join(repr(n) for n in shown) + "]" + more


def content_error(exc: BaseException) -> str:
    """A parser's error, bounded and redacted: its type and the start of its message."""
    return f"{type(exc).__name__}: {bounded(str(exc), 160)}"


def check_column_mapping(columns: Mapping[str, str], canonical: Iterable[str]) -> dict[str, str]:
    """Validate a canonical -> source column mapping; returns a private copy.

    Raises ``ValueError`` naming unknown canonical columns (with the valid names) or source
    columns mapped to more than one canonical column.
    """
    valid = tuple(canonical)
    unknown = [k for k in columns if k not in valid]
    if unknown:
        raise ValueError(
            f"unknown canonical column(s) {unknown} in the column mapping; "
            f"valid canonical names: {', '.join(valid)}"
        )
    sources = list(columns.values())
    dupes = sorted({s for s in sources if sources.count(s) > 1})
    if dupes:
        raise ValueError(
            f"source column(s) {dupes} mapped to more than one canonical column; map each source column once"
        )
    return dict(columns)


@dataclass(frozen=True)
class CanonicalMapping:
    """Canonical column name -> source column name, checked by :func:`check_column_mapping` against
    the subclass's :attr:`canonical` names (a vertical's ``schema.ColumnMapping``); a private copy,
    hashable."""

    columns: Mapping[str, str] = field(default_factory=dict)
    #: the canonical columns a mapping may target (set by each subclass)
    canonical: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        # a private copy, so later changes to the caller's dict cannot leak in
        object.__setattr__(self, "columns", check_column_mapping(self.columns, self.canonical))

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.columns.items())))


def write_table(frame: pd.DataFrame, target: Path, csv: bool = False) -> Path | None:
    """Write ``frame`` as Parquet, and as CSV beside it if asked, each atomically (readers
    never see a half-written file). Returns the CSV's path when one was written.

    The CSV is for people and spreadsheets: text cells that a spreadsheet would run as a
    formula are escaped (:func:`escape_formulas`); the Parquet keeps the values as they are.
    """
    with atomic_path(target) as tmp:
        frame.to_parquet(tmp, index=False)
    if not csv:
        return None
    csv_path = target.with_suffix(".csv")
    with atomic_path(csv_path) as tmp:
        # CRLF rows (RFC 4180): the writer then quotes a cell holding a bare CR, which would end a row
        escape_formulas(frame).to_csv(tmp, index=False, lineterminator="\r\n")
    return csv_path


#: First characters that make a spreadsheet read a cell as a formula (OWASP CSV injection).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def escape_cell(value: object) -> object:
    """A text cell starting with ``= + - @``, a tab or a carriage return, prefixed with ``'``
    so a spreadsheet shows it as text; plain numbers (``-1.5``) and non-text values unchanged."""
    if not isinstance(value, str) or not value.startswith(FORMULA_PREFIXES):
        return value
    if _PLAIN_NUMBER.fullmatch(value):
        return value
    return "'" + value


def escape_formulas(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells (and column names) are escaped with :func:`escape_cell`."""
    out = frame.copy()
    for name in out.columns:
        col = out[name]
        if pd.api.types.is_object_dtype(col) or pd.api.types.is_string_dtype(col) or isinstance(
            col.dtype, pd.CategoricalDtype
        ):
            out[name] = col.astype(object).map(escape_cell)
    out.columns = [escape_cell(c) for c in out.columns]
    return out


# --------------------------------------------------------------------------------------
# schemas


ColumnKind = Literal["id", "float", "int", "datetime", "binary", "category", "str"]
MAX_ROWS_SHOWN = 5


class ColumnSpec(BaseModel):
    """One column of a table schema."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: ColumnKind
    required: bool = True
    nullable: bool = False
    min_value: float | None = None
    #: Largest absolute value of a float/int column (None: any finite value). Bounds what a value
    #: can do downstream: sums and means of bounded values cannot overflow to infinity.
    max_abs: float | None = None


class TableSchema(BaseModel):
    """What a table must look like. The label column, if any, must hold both classes."""

    model_config = ConfigDict(frozen=True)

    name: str
    columns: tuple[ColumnSpec, ...]
    time_column: str | None = None
    label_column: str | None = None
    min_rows: int = 1

    def fingerprint(self) -> str:
        return stable_hash(self.model_dump())


# --------------------------------------------------------------------------------------
# reading and validation


def _bad_rows(mask: pd.Series) -> list[int]:
    return [int(i) for i in np.flatnonzero(mask.to_numpy())[:MAX_ROWS_SHOWN]]


def validate_table(df: pd.DataFrame, schema: TableSchema, source: str) -> pd.DataFrame:
    """Coerce types and check a table against ``schema``.

    Returns a new frame with only the schema's columns (optional ones when present),
    typed, in file order. Raises :class:`DataValidationError` naming the file, the column
    and the first offending rows (0-based data rows; CSV line = row + 2), and never any
    other error for bad cells. Messages quote no cell (only a bounded list of column names).
    """
    if len(df) < schema.min_rows:
        raise DataValidationError(
            f"has {len(df)} rows, at least {schema.min_rows} needed", source=source
        )
    missing = [c.name for c in schema.columns if c.required and c.name not in df.columns]
    if missing:
        raise DataValidationError(
            f"missing required column(s) {missing}; the file has {describe_columns(df.columns)}. "
            "Map differently named columns with a column mapping (e.g. --columns "
            f"{missing[0]}=YOUR_COLUMN).",
            source=source,
            column=missing[0],
        )
    out: dict[str, pd.Series] = {}
    for spec in schema.columns:
        if spec.name not in df.columns:
            continue
        raw = df[spec.name].reset_index(drop=True)
        if isinstance(raw, pd.DataFrame):
            raise DataValidationError("the column appears more than once", source=source, column=spec.name)
        try:
            col = _coerce(raw, spec, source)
        except DataValidationError:
            raise
        except (ValueError, TypeError, OverflowError, ArithmeticError, pd.errors.OutOfBoundsDatetime) as exc:
            raise DataValidationError(f"values cannot be read as {spec.kind}: {type(exc).__name__}",
                                      source=source, column=spec.name) from exc
        if not spec.nullable:
            _refuse_rows(col.isna(), "empty value(s) where none are allowed", source, spec.name)
        if spec.min_value is not None and spec.kind in {"float", "int"}:
            _refuse_rows(col < spec.min_value, f"value(s) below the minimum {spec.min_value}", source, spec.name)
        if spec.max_abs is not None and spec.kind in {"float", "int"}:
            _refuse_rows(col.abs() > spec.max_abs, f"value(s) beyond the bound |x| <= {spec.max_abs:g}", source,
                         spec.name)
        out[spec.name] = col
    table = pd.DataFrame(out)
    if schema.label_column and schema.label_column in table:
        counts = table[schema.label_column].value_counts()
        if len(counts) < 2:
            only = counts.index[0] if len(counts) else "none"
            raise DataValidationError(
                f"labels are all one class ({only!r}); a binary classifier needs both 0 and 1",
                source=source,
                column=schema.label_column,
            )
    return table


def _refuse_rows(mask: pd.Series, what: str, source: str, column: str) -> None:
    """Raise naming how many rows ``mask`` flags and the first of them, when it flags any."""
    if mask.any():
        raise DataValidationError(f"{int(mask.sum())} {what}", source=source, column=column,
                                  rows=_bad_rows(mask))


def _coerce(raw: pd.Series, spec: ColumnSpec, source: str) -> pd.Series:
    present = raw.notna()
    if spec.kind in {"float", "int"}:
        if pd.api.types.is_datetime64_any_dtype(raw):  # else read as nanoseconds since 1970
            _refuse_rows(present, "timestamp(s) where numbers are expected", source, spec.name)
        col = pd.to_numeric(raw, errors="coerce")
        bad = present & col.isna()
        if not bad.any():
            bad = present & ~np.isfinite(col.astype("float64").fillna(0.0))
        _refuse_rows(bad, "non-numeric or infinite value(s)", source, spec.name)
        return col.astype("float64") if spec.kind == "float" else col
    if spec.kind == "datetime":
        if pd.api.types.is_datetime64_any_dtype(raw):
            col = raw
        elif pd.api.types.is_numeric_dtype(raw):  # else read as nanoseconds since 1970
            _refuse_rows(present, "number(s) where timestamps are expected", source, spec.name)
            col = raw
        else:
            col = pd.to_datetime(raw, errors="coerce", format="mixed")
        bad = present & col.isna()
        _refuse_rows(bad, "unparseable timestamp(s)", source, spec.name)
        if getattr(col.dt, "tz", None) is not None:
            col = col.dt.tz_convert("UTC").dt.tz_localize(None)
        outside = col.notna() & ((col < pd.Timestamp.min) | (col > pd.Timestamp.max))
        _refuse_rows(outside, f"timestamp(s) outside the supported range {pd.Timestamp.min:%Y-%m-%d} "
                     f"to {pd.Timestamp.max:%Y-%m-%d}", source, spec.name)
        return col.astype("datetime64[ns]")
    if spec.kind == "binary":
        mapped = raw.map(_to_binary)
        bad = present & mapped.isna()
        _refuse_rows(bad, "value(s) that are not a binary label (0/1, true/false)", source, spec.name)
        return mapped.astype("Int8") if spec.nullable else mapped.astype("int8")
    if spec.kind == "id" and pd.api.types.is_float_dtype(raw):
        # a numeric id column with a missing value is read as floats: 5.0 is id "5", as in a
        # column without gaps (one account, however the file or request spells its number)
        whole = raw.notna() & (raw == np.floor(raw))
        text = raw.astype("string")
        text[whole] = raw[whole].map(lambda v: str(int(v)))
        return text
    # id, category, str: keep as strings (ids may be numeric in the file)
    return raw.astype("string")


_TRUE = {"1", "1.0", "true", "t", "yes", "y"}
_FALSE = {"0", "0.0", "false", "f", "no", "n"}


def _to_binary(value: object) -> float:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return np.nan
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return 1.0
    if text in _FALSE:
        return 0.0
    return np.nan


# --------------------------------------------------------------------------------------
# pre-flight: the header and the first rows, before any run starts

#: How many rows after the header the pre-flight check reads.
SAMPLE_ROWS = 1000
#: Kinds whose offending value the pre-flight error shows (numbers and dates, no ids or text).
SHOWN_KINDS = {"float", "int", "datetime"}


def read_sample(path: Path, encoding: str | None = None, rows: int = SAMPLE_ROWS) -> pd.DataFrame:
    """The header and the first ``rows`` rows of a CSV or Parquet file, by the content rules
    and errors of :func:`read_table`."""
    if not path.is_file():
        raise DataValidationError("file not found", source=str(path))

    def parquet_head(p: Path) -> pd.DataFrame:
        import pyarrow as pa
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(p)
        batch = next(parquet.iter_batches(batch_size=rows), None)
        return (pa.Table.from_batches([batch]) if batch is not None else parquet.schema_arrow.empty_table()).to_pandas()

    return _read_by_content(path, encoding, parquet_head,
                            lambda p, enc: pd.read_csv(p, nrows=rows, low_memory=False, encoding=enc))


def shown_value(value: object, limit: int = 40) -> str:
    """A number or a timestamp of a file, printable, on one line and cut to ``limit`` characters."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_sample(path: Path, schema: TableSchema, columns: Mapping[str, str] | None = None,
                 encoding: str | None = None, rows: int = SAMPLE_ROWS) -> None:
    """Pre-flight: the file (through the canonical -> source ``columns`` mapping) has the
    schema's required columns, and its first ``rows`` rows read as the schema's kinds.

    Raises:
        DataValidationError: as :func:`validate_table` names the file, the column and the
            rows; for a number or a timestamp also the file's column, the row and its value.
    """
    mapping = dict(columns or {})
    check_mapped_columns(path, mapping, encoding)
    sample = read_sample(path, encoding, rows).rename(columns={src: canon for canon, src in mapping.items()})
    try:
        validate_table(sample, schema.model_copy(update={"min_rows": 0, "label_column": None}), str(path))
    except DataValidationError as exc:
        if not exc.rows:
            raise
        kinds = {spec.name: spec.kind for spec in schema.columns}
        row = exc.rows[0]
        detail = f"; in the first {len(sample)} rows read before the run"
        if kinds.get(exc.column or "") in SHOWN_KINDS:
            where = mapping.get(exc.column or "", exc.column)
            detail += f", row {row} of {where!r} holds {shown_value(sample[exc.column].iloc[row])!r}"
        shown = DataValidationError(f"{exc}{detail}")
        shown.source, shown.column, shown.rows = exc.source, exc.column, exc.rows
        raise shown from None


# --------------------------------------------------------------------------------------
# time-ordered splits


class TimeSplit(BaseModel):
    """Period boundaries counted back from the end of the data (half-open intervals)."""

    model_config = ConfigDict(frozen=True)

    train_start: dt.datetime
    val_start: dt.datetime
    train_end: dt.datetime
    test_start: dt.datetime
    end: dt.datetime

    def describe(self) -> str:
        return (
            f"train [{self.train_start:%Y-%m-%d}, {self.val_start:%Y-%m-%d}) "
            f"val [{self.val_start:%Y-%m-%d}, {self.train_end:%Y-%m-%d}) "
            f"delay [{self.train_end:%Y-%m-%d}, {self.test_start:%Y-%m-%d}) "
            f"test [{self.test_start:%Y-%m-%d}, {self.end:%Y-%m-%d})"
        )


def time_split(
    timestamps: pd.Series,
    *,
    train_days: float,
    delay_days: float,
    test_days: float,
    val_days: float = 0.0,
) -> TimeSplit:
    """Periods counted back from the end of the data: ``[... history | train | val | delay | test]``.

    ``val`` is the last part of the training period (labels known, used for early stopping
    and thresholds); ``delay`` holds transactions whose labels are not known yet and is
    never trained on. Everything before ``train_start`` is history only.
    """
    if min(train_days, test_days) <= 0 or min(delay_days, val_days) < 0:
        raise ValueError("train_days and test_days must be > 0; delay_days, val_days >= 0")
    if val_days >= train_days:
        raise ValueError(f"val_days ({val_days}) must be smaller than train_days ({train_days})")
    last = pd.Timestamp(timestamps.max())
    first = pd.Timestamp(timestamps.min())
    end = last.normalize() + pd.Timedelta(days=1)
    test_start = end - pd.Timedelta(days=test_days)
    train_end = test_start - pd.Timedelta(days=delay_days)
    train_start = train_end - pd.Timedelta(days=train_days)
    val_start = train_end - pd.Timedelta(days=val_days)
    if train_start < first.normalize():
        span = (end - first.normalize()).days
        raise DataValidationError(
            f"the data spans {span} days ({first:%Y-%m-%d} to {last:%Y-%m-%d}) but the split "
            f"needs {train_days + delay_days + test_days:g} (train {train_days:g} + delay "
            f"{delay_days:g} + test {test_days:g}); shorten the periods"
        )
    return TimeSplit(
        train_start=train_start.to_pydatetime(),
        val_start=val_start.to_pydatetime(),
        train_end=train_end.to_pydatetime(),
        test_start=test_start.to_pydatetime(),
        end=end.to_pydatetime(),
    )


def assign_periods(timestamps: pd.Series, split: TimeSplit) -> np.ndarray:
    """Label each timestamp ``history``, ``train``, ``val``, ``delay`` or ``test``."""
    ts = pd.to_datetime(timestamps).to_numpy()
    edges = np.array(
        [split.train_start, split.val_start, split.train_end, split.test_start],
        dtype="datetime64[ns]",
    )
    names = np.array(["history", "train", "val", "delay", "test"])
    return names[np.searchsorted(edges, ts, side="right")]
