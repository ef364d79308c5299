"""The C-MAPSS reader on files written here in the exact NASA format (trailing spaces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infra.errors import DataValidationError
from solutions.sensor import schema as S
from solutions.sensor.cmapss import COLUMNS, check_subset, load_cmapss, read_cmapss_file, read_rul_file
from solutions.sensor.schema import BadReadingReport


def _line(unit: int, cycle: int, rng: np.random.Generator) -> str:
    ops = [f"{rng.normal(0, 0.002):.4f}", f"{rng.normal(0, 0.0003):.4f}", "100.0"]
    sensors = [f"{518.67 + rng.normal(0, 0.5):.2f}" for _ in range(21)]
    # the NASA files separate fields with one space and end each line with two spaces
    return " ".join([str(unit), str(cycle), *ops, *sensors]) + "  \n"


def write_subset(folder: Path, subset: str = "FD001", train_len=(40, 35), test_len=(32, 20), rul=(12, 80)) -> None:
    rng = np.random.default_rng(0)
    with open(folder / f"train_{subset}.txt", "w") as fh:
        for u, n in enumerate(train_len, start=1):
            fh.writelines(_line(u, c, rng) for c in range(1, n + 1))
    with open(folder / f"test_{subset}.txt", "w") as fh:
        for u, n in enumerate(test_len, start=1):
            fh.writelines(_line(u, c, rng) for c in range(1, n + 1))
    (folder / f"RUL_{subset}.txt").write_text("".join(f"{r} \n" for r in rul))


def test_reads_exact_format_with_trailing_spaces(tmp_path: Path) -> None:
    write_subset(tmp_path)
    raw = read_cmapss_file(tmp_path / "train_FD001.txt")
    assert list(raw.columns) == list(COLUMNS) and len(COLUMNS) == 26
    assert len(raw) == 75 and raw["unit"].tolist()[:2] == [1, 1]
    assert read_rul_file(tmp_path / "RUL_FD001.txt").tolist() == [12, 80]
    grid, report = load_cmapss(tmp_path, "fd001")
    assert report.readings_in == report.readings_used == (75 + 52) * 24  # every value read, none bad
    assert report.bad_total() == 0 and report.rows_dropped == 0
    train = grid[grid[S.SET] == "train"]
    first = train[train[S.ASSET] == "train-1"]
    assert first[S.RUL].iloc[0] == 39 and first[S.RUL].iloc[-1] == 0  # run to failure
    test = grid[grid[S.SET] == "test"]
    last = test.groupby(S.ASSET)[S.RUL].min().to_dict()
    assert last == {"test-1": 12, "test-2": 80}  # the RUL file gives the last cycle's RUL
    assert test[S.FAILED].all()


def test_wrong_column_count_names_the_line(tmp_path: Path) -> None:
    write_subset(tmp_path)
    path = tmp_path / "train_FD001.txt"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = " ".join(lines[3].split()[:-1]) + "  \n"
    path.write_text("".join(lines))
    with pytest.raises(DataValidationError, match="line 4 has 25 fields"):
        read_cmapss_file(path)


def _corrupt(path: Path, edits: dict[tuple[int, int], str]) -> None:
    """Replace field ``(line, field)`` of a C-MAPSS file (0-based) with the given text."""
    lines = path.read_text().splitlines(keepends=True)
    for (line, field), text in edits.items():
        fields = lines[line].split()
        fields[field] = text
        lines[line] = " ".join(fields) + "  \n"
    path.write_text("".join(lines))


def test_bad_values_are_counted_and_left_out(tmp_path: Path) -> None:
    write_subset(tmp_path)
    path = tmp_path / "train_FD001.txt"
    # sensor_3 on line 6 is text, sensor_5 on line 8 is written NaN, two infinities, and
    # line 11 has no readable cycle: that line cannot be placed and is dropped whole
    _corrupt(path, {(5, 7): "n/a", (7, 9): "NaN", (9, 12): "inf", (12, 3): "-inf", (10, 1): "?", (10, 6): "x"})
    report = BadReadingReport(source="t")
    raw = read_cmapss_file(path, report)
    assert len(raw) == 74 and 11 not in raw.loc[raw["unit"] == 1, "cycle"].tolist()
    assert (report.non_numeric, report.nan, report.inf, report.rows_dropped) == (1, 1, 2, 1)
    assert report.readings_in == 75 * 24
    assert report.readings_used == 74 * 24 - 4  # the dropped line's 24 and the 4 bad values
    assert np.isnan(raw.loc[5, "sensor_3"]) and np.isnan(raw.loc[7, "sensor_5"]) and np.isnan(raw.loc[9, "sensor_8"])
    assert "rows dropped 1" in report.summary()


def test_load_cmapss_reports_what_both_files_held(tmp_path: Path) -> None:
    write_subset(tmp_path)
    _corrupt(tmp_path / "test_FD001.txt", {(0, 4): "nan", (3, 20): "bad"})
    grid, report = load_cmapss(tmp_path, "FD001")
    assert report.source == str(tmp_path)
    assert (report.nan, report.non_numeric, report.inf) == (1, 1, 0)
    assert report.readings_in == (75 + 52) * 24 and report.readings_used == report.readings_in - 2
    test = grid[grid[S.SET] == "test"]
    assert len(test) == 52 and test["op_setting_3"].isna().sum() == 1


def test_a_column_of_text_names_column_and_rows(tmp_path: Path) -> None:
    write_subset(tmp_path)
    path = tmp_path / "train_FD001.txt"
    _corrupt(path, {(line, 7): "n/a" for line in range(5, 75)})
    with pytest.raises(DataValidationError, match="sensor_3") as info:
        read_cmapss_file(path)
    assert info.value.rows == [5, 6, 7, 8, 9]


def test_cycles_out_of_order_is_an_error(tmp_path: Path) -> None:
    write_subset(tmp_path)
    path = tmp_path / "train_FD001.txt"
    lines = path.read_text().splitlines(keepends=True)
    lines[2], lines[3] = lines[3], lines[2]
    path.write_text("".join(lines))
    with pytest.raises(DataValidationError, match="out of order"):
        read_cmapss_file(path)


def test_rul_file_must_match_test_units(tmp_path: Path) -> None:
    write_subset(tmp_path, rul=(12,))
    with pytest.raises(DataValidationError, match="1 values but test_FD001.txt has 2 units"):
        load_cmapss(tmp_path, "FD001")


def test_subset_must_be_known() -> None:
    assert check_subset(" fd004") == "FD004"
    with pytest.raises(DataValidationError, match="unknown C-MAPSS subset 'FD009'"):
        check_subset("FD009")


def test_missing_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataValidationError, match="--cmapss-dir"):
        load_cmapss(tmp_path, "FD002")
