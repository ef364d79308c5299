"""The sensor flows end to end on a tiny fleet, against a real (test) Prefect API."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from flows.sensor.cli import main
from solutions.sensor import schema as S

FLEET = ["--n-assets", "16", "--min-life", "45", "--max-life", "70", "--seed", "1"]
TINY = [*FLEET, "--window", "12", "--horizon", "10"]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_pretrain_train_score_end_to_end(capsys: pytest.CaptureFixture) -> None:
    assert main(["pretrain", *TINY, "--pretrain-epochs", "1", "--encoder", "enc-tiny", "--json"]) == 0
    pre = _last_json(capsys.readouterr().out)
    assert pre["model"]["name"] == "enc-tiny" and pre["promotion"]["promoted"] is True
    assert pre["windows"]["train"] > 0 and pre["bad_readings"]["readings_in"] > 0

    args = ["train", *TINY, "--max-epochs", "2", "--encoder", "enc-tiny", "--model", "rul-tiny", "--json"]
    assert main([*args, "--label-fraction", "0.5"]) == 0
    tuned = _last_json(capsys.readouterr().out)
    assert tuned["pretrained_from"] == "enc-tiny:1"
    assert tuned["labelled_assets"] < tuned["assets"]["train"]
    assert tuned["freeze"] is not None and tuned["train"]["epochs_trained_now"] == [0, 1]
    assert tuned["rul"]["rmse"] >= 0 and "phm08" in tuned["rul"]["extra"]
    assert tuned["baseline_rul"]["n"] == tuned["rul"]["n"]  # same test units
    assert tuned["model"]["version"] == 1 and tuned["promotion"]["promoted"] is True
    assert Path(tuned["report_dir"], "report.md").exists()
    assert Path(tuned["report_dir"], "rul_pred_vs_true.png").exists()

    assert main([*args, "--no-pretrain", "--no-baseline"]) == 0
    scratch = _last_json(capsys.readouterr().out)
    assert scratch["pretrained_from"] is None and scratch["baseline_rul"] is None
    assert scratch["model"]["version"] == 2  # champion rule decides; lower test RMSE wins
    # (v1 is whichever candidate won on validation: the champion value is its re-scored test RMSE)
    assert scratch["promotion"]["promoted"] == (scratch["rul"]["rmse"] < scratch["promotion"]["champion_value"])

    out_file = Path(tuned["report_dir"]).parent / "scores-tiny.parquet"
    assert main(["score", *FLEET, "--model", "rul-tiny:1", "--output", str(out_file), "--json"]) == 0
    scored = _last_json(capsys.readouterr().out)
    frame = pd.read_parquet(out_file)
    assert scored["assets_scored"] == len(frame) == 16
    assert {"predicted_rul", "failure_probability", "alert", "model_version"} <= set(frame.columns)
    assert (frame["model_version"] == 1).all() and frame["predicted_rul"].between(0, 125).all()


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    readings = tmp_path / "readings.csv"
    pd.DataFrame({S.ASSET: ["A"] * 3, S.TIMESTAMP: [0, 1, 2], S.VALUE: [1.0, 2.0, 3.0]}).to_csv(readings, index=False)
    assert main(["train", "--data", str(readings), "--no-pretrain"]) == 2
    err = capsys.readouterr().err
    assert "missing required column(s) ['sensor']" in err and "--columns" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pretrain", "--data", "{tmp}/absent.csv"], "absent.csv: file not found"),
        (["pretrain", "--columns", "machine=asset_id"], "--columns: unknown canonical column(s) ['machine']"),
        (["train", "--data", "{tmp}/readings.csv", "--cmapss-dir", "{tmp}"], "not both"),
        (["train", "--cmapss-dir", "{tmp}", "--subset", "FD005"], "--subset: unknown C-MAPSS subset 'FD005'"),
        (["train", "--cmapss-dir", "{tmp}"], "has no train_FD001.txt, test_FD001.txt, RUL_FD001.txt"),
        (["train", "--label-fraction", "0"], "--label-fraction: Input should be greater than 0"),
        (["score", "--data", "{tmp}/readings.csv", "--columns", "sensor=probe"],
         "the column mapping names ['probe'], which the table does not have"),
        (["score", "--threshold", "1.5"], "--threshold must be between 0 and 1"),
        (["score", "--events", "{tmp}/readings.csv"], "give data too"),
        (["batch", "--inbox", "{tmp}/nowhere"], "--inbox: {tmp}/nowhere does not exist"),
        (["batch", "--columns", "asset=machine"], "unknown canonical column(s) ['asset']"),
        (["batch", "--settle-seconds", "-1"], "--settle-seconds must be >= 0"),
    ],
)
def test_bad_invocations_exit_2_with_one_error_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    readings = tmp_path / "readings.csv"
    pd.DataFrame({S.ASSET: ["A"], S.TIMESTAMP: [0], S.SENSOR: ["t"], S.VALUE: [1.0]}).to_csv(readings, index=False)
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert message.replace("{tmp}", str(tmp_path)) in lines[0]
    assert "Traceback" not in out + err


def _write_cmapss(folder: Path) -> None:
    """Tiny C-MAPSS FD001-format files: space separated, no header, two trailing spaces."""
    import numpy as np

    rng = np.random.default_rng(0)

    def lines(lengths: tuple[int, ...]) -> str:
        out = []
        for unit, n in enumerate(lengths, start=1):
            for cycle in range(1, n + 1):
                wear = cycle / n
                sensors = [f"{500 + 10 * wear + rng.normal(0, 0.3):.2f}" for _ in range(21)]
                out.append(" ".join([str(unit), str(cycle), "0.0001", "-0.0002", "100.0", *sensors]) + "  \n")
        return "".join(out)

    (folder / "train_FD001.txt").write_text(lines((40, 45, 50, 42, 48, 44)))
    (folder / "test_FD001.txt").write_text(lines((20, 8)))  # the second unit is shorter than a window
    (folder / "RUL_FD001.txt").write_text("15 \n30 \n")


def test_cmapss_train_and_score(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _write_cmapss(tmp_path)
    train_file = tmp_path / "train_FD001.txt"
    lines = train_file.read_text().splitlines(keepends=True)
    for number, text in ((3, "nan"), (5, "x")):  # two bad sensor values the reader must count
        fields = lines[number].split()
        fields[10] = text
        lines[number] = " ".join(fields) + "  \n"
    train_file.write_text("".join(lines))
    src = ["--cmapss-dir", str(tmp_path), "--subset", "FD001"]
    assert main(["train", *src, "--window", "10", "--no-pretrain", "--max-epochs", "1", "--model", "rul-cmapss", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["rul"]["n"] == 2  # the last window of each test unit, the short one padded
    assert result["bad_readings"]["padded_assets"] == ["test-2"]
    assert result["assets"]["test"] == 2
    bad = result["bad_readings"]
    assert (bad["nan"], bad["non_numeric"], bad["readings_in"]) == (1, 1, (269 + 28) * 24)
    assert bad["readings_used"] == bad["readings_in"] - 2
    assert main(["score", *src, "--model", "rul-cmapss", "--json"]) == 0
    scored = _last_json(capsys.readouterr().out)
    assert scored["assets_scored"] == 2 and scored["input"].startswith("C-MAPSS FD001")
    measured = {k: bad[k] for k in ("readings_in", "readings_used", "nan", "non_numeric", "inf", "rows_dropped")}
    assert {k: scored["bad_readings"][k] for k in measured} == measured  # what the reader counted


def test_cmapss_train_file_alone_holds_out_engines(
    tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    _write_cmapss(tmp_path)
    (tmp_path / "test_FD001.txt").unlink()
    (tmp_path / "RUL_FD001.txt").unlink()
    src = ["--cmapss-dir", str(tmp_path), "--subset", "FD001"]
    args = ["train", *src, "--window", "10", "--no-pretrain", "--max-epochs", "1", "--model", "rul-held-out", "--json"]
    with caplog.at_level("INFO"):
        assert main(args) == 0
    out, err = capsys.readouterr()
    result = _last_json(out)
    assert result["assets"] == {"train": 4, "val": 1, "test": 1}  # the 6 engines of the train file, split by engine
    assert result["rul"]["n"] == 4  # the held-out engine cut 4 times, as a test file would be
    assert "train file only: test engines held out of it" in Path(result["report_dir"], "report.md").read_text()
    # the card: RMSE and the PHM08 score with bootstrap intervals over the test engines
    from infra.registry import ModelRegistry

    card = json.loads((Path(ModelRegistry().versions("rul-held-out")[-1].path) / "card.json").read_text())
    phm = next(m for m in card["metrics"] if m["metric"] == "phm08")
    assert phm["n"] == 4 and phm["low"] <= phm["value"] <= phm["high"]
    assert card["data"]["test engines"] == 1 and "over test engines" in card["data"]["intervals"]
    assert "1 of 6 assets held out for test" in caplog.text  # and the run log says so
    assert "Traceback" not in out + err and " ERROR " not in out + err


def test_batch_scores_each_new_readings_file_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from solutions.sensor.align import load_readings
    from solutions.sensor.config import AlignConfig, SyntheticFleetConfig
    from solutions.sensor.schema import ColumnMapping
    from solutions.sensor.synthetic import generate_fleet

    args = ["train", *TINY, "--no-pretrain", "--no-baseline", "--max-epochs", "1", "--model", "rul-batch"]
    assert main(args) == 0
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for seed in (3, 4):
        readings, _ = generate_fleet(SyntheticFleetConfig(n_assets=5, min_life=45, max_life=60, seed=seed))
        readings.to_parquet(inbox / f"site-{seed}.parquet", index=False)
    (inbox / "garbled.csv").write_text("asset_id;timestamp;sensor;value\nA;x;y;z\n")
    capsys.readouterr()
    batch = ["batch", "--inbox", str(inbox), "--model", "rul-batch", "--settle-seconds", "0", "--json"]
    assert main(batch) == 0
    first = _last_json(capsys.readouterr().out)
    assert first["scored"] == 2 and first["quarantined"] == 1 and first["rows"] == 10
    assert "garbled.csv" in " ".join(first["quarantine"])
    assert sorted(first["bad_readings"]) == sorted(first["outputs"])
    for output, report in first["bad_readings"].items():  # exactly what the reader measured in that file
        site = next(inbox.glob(f"{Path(output).name.split('-')[0]}-{Path(output).name.split('-')[1]}.parquet"))
        measured = load_readings(site, ColumnMapping({}), AlignConfig())[1]
        assert report == json.loads(measured.model_dump_json()) | {"padded_assets": report["padded_assets"]}
        assert report["readings_in"] > report["readings_used"] > 0 and report["nan"] + report["inf"] > 0
    frame = pd.read_parquet(first["outputs"][0])
    assert (frame["model_version"] == 1).all() and len(frame) == 5
    assert main(batch) == 0
    again = _last_json(capsys.readouterr().out)
    assert again["new_files"] == 0 and again["seen_before"] == 3


def test_cmapss_train_with_a_transformer_trunk(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--arch transformer`` pre-trains a transformer encoder, fine-tunes it, registers it (its
    params say so) and scores with it, as the CNN does; ``--extra-archs tcn`` also pre-trains and
    trains a TCN, and the network with the lower validation RMSE is the network candidate."""
    from infra.registry import ModelRegistry

    _write_cmapss(tmp_path)
    src = ["--cmapss-dir", str(tmp_path), "--subset", "FD001"]
    assert main(["train", *src, "--window", "10", "--arch", "transformer", "--extra-archs", "tcn",
                 "--pretrain-epochs", "1", "--max-epochs", "1", "--members", "1", "--model", "rul-attn", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["pretrained_from"] and result["rul"]["n"] == 2
    registry = ModelRegistry()
    ref = registry.versions("rul-attn")[-1]
    nets = {a: ref.metrics[f"val/network-{a}/rmse"] for a in ("transformer", "tcn")}
    best = min(nets, key=nets.get)
    assert ref.params["hparams"]["arch"] == best  # the network's params, whichever candidate won
    assert ref.metrics["val/cnn/rmse"] == pytest.approx(nets[best])
    assert {v.params["hparams"]["arch"] for v in registry.versions("sensor-encoder")} == {"transformer", "tcn"}
    assert main(["score", *src, "--model", "rul-attn", "--json"]) == 0
    assert _last_json(capsys.readouterr().out)["assets_scored"] == 2
