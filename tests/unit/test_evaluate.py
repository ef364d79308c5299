"""Unit tests for tasks.evaluate (plain functions, no Prefect server)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

from infra.errors import DataValidationError
from tasks import evaluate as ev
from tasks.evaluate import (
    EvalReport,
    artifact_key,
    choose_threshold,
    evaluate_binary,
    plot_comparison,
    publish_eval_report,
    render_eval_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def random_example() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = (rng.random(500) < 0.2).astype(int)
    score = rng.normal(size=500) + 1.2 * y
    return y, score


@pytest.fixture
def fpr_example() -> tuple[np.ndarray, np.ndarray]:
    """100 negatives scored 0.00..0.99 and 10 positives with known ranks.

    Positives: 4 at 2.0 (above every negative), 3 at 0.985 (only the 0.99
    negative is above them), 3 at 0.5.
    """
    neg = np.arange(100) / 100
    pos = np.array([2.0] * 4 + [0.985] * 3 + [0.5] * 3)
    y = np.r_[np.zeros(100, int), np.ones(10, int)]
    return y, np.r_[neg, pos]


def test_ranking_metrics_match_sklearn(random_example):
    y, s = random_example
    report = evaluate_binary(y, s, name="m", threshold=0.5)
    assert report.roc_auc == pytest.approx(roc_auc_score(y, s))
    assert report.pr_auc == pytest.approx(average_precision_score(y, s))
    assert report.f1 == pytest.approx(f1_score(y, s >= 0.5))
    assert report.n == 500
    assert report.n_positive == int(y.sum())


def test_metrics_keys_are_split_prefixed(random_example):
    y, s = random_example
    report = evaluate_binary(y, s, name="m", split="val")
    metrics = report.metrics()
    assert set(metrics) == {
        "val/roc_auc",
        "val/auprc",
        "val/recall_at_fpr",
        "val/precision",
        "val/recall",
        "val/f1",
    }
    assert metrics["val/auprc"] == report.pr_auc


@pytest.mark.parametrize(
    ("fpr_target", "recall", "threshold"),
    [(0.0, 0.4, 2.0), (0.01, 0.7, 0.985), (0.02, 0.7, 0.98), (0.5, 1.0, 0.5)],
)
def test_recall_at_fpr_hand_example(fpr_example, fpr_target, recall, threshold):
    y, s = fpr_example
    report = evaluate_binary(y, s, name="m", fpr_target=fpr_target)
    assert report.recall_at_fpr == pytest.approx(recall)
    assert report.fpr_target == fpr_target
    assert choose_threshold(y, s, method="fpr", fpr_target=fpr_target) == pytest.approx(
        threshold
    )


def test_fpr_threshold_above_all_scores_when_bound_unreachable():
    # The top score is a negative, so FPR=0 means predicting nothing positive.
    y = np.array([0, 1, 0, 1])
    s = np.array([0.9, 0.8, 0.1, 0.2])
    t = choose_threshold(y, s, method="fpr", fpr_target=0.0)
    assert np.isfinite(t) and t > 0.9
    report = evaluate_binary(y, s, name="m", threshold=t, fpr_target=0.0)
    assert report.recall_at_fpr == 0.0
    assert report.confusion == [[2, 0], [2, 0]]
    assert report.precision == 0.0 and report.f1 == 0.0


def test_choose_threshold_max_f1():
    y = np.array([0, 0, 1, 1, 0, 1])
    s = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    # thresholds 0.6/0.5/0.4/0.3/0.2 give F1 0.5/0.4/0.667/0.857/0.75
    assert choose_threshold(y, s) == pytest.approx(0.3)


def test_confusion_counts_and_threshold_metrics():
    y = np.array([0, 0, 1, 1, 0, 1])
    s = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    report = evaluate_binary(y, s, name="m", threshold=0.35)
    # predicted positive: 0.4, 0.5, 0.6 -> tp=2 (0.4, 0.6), fp=1 (0.5)
    assert report.confusion == [[2, 1], [1, 2]]
    assert report.precision == pytest.approx(2 / 3)
    assert report.recall == pytest.approx(2 / 3)
    assert report.f1 == pytest.approx(2 / 3)
    assert report.threshold == 0.35


def test_threshold_none_uses_max_f1_on_same_labels():
    y = np.array([0, 0, 1, 1, 0, 1])
    s = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    report = evaluate_binary(y, s, name="m")
    assert report.threshold == pytest.approx(0.3)
    assert report.confusion == [[2, 1], [0, 3]]


def test_accepts_bool_labels_and_lists():
    report = evaluate_binary([False, True, True, False], [0.1, 0.9, 0.8, 0.3], name="m")
    assert report.roc_auc == 1.0
    assert report.n_positive == 2


def test_report_is_frozen(random_example):
    y, s = random_example
    report = evaluate_binary(y, s, name="m")
    with pytest.raises(ValidationError):
        report.roc_auc = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("y", "s", "match"),
    [
        ([1, 1, 1], [0.1, 0.2, 0.3], "only class 1"),
        ([0, 0], [0.1, 0.2], "only class 0"),
        ([0, 1, 0], [0.1, np.nan, 0.3], "non-finite"),
        ([0, 1, 0], [0.1, np.inf, 0.3], "non-finite"),
        ([0, 1, 0], [0.1, 0.2], "length mismatch"),
        ([0, 1, 2], [0.1, 0.2, 0.3], "only 0 and 1"),
        ([], [], "empty"),
        ([[0, 1]], [[0.1, 0.2]], "1-D"),
    ],
)
def test_invalid_inputs_raise_value_error(y, s, match):
    with pytest.raises(ValueError, match=match):
        evaluate_binary(y, s, name="m")
    with pytest.raises(DataValidationError, match=match):
        choose_threshold(y, s)


def test_invalid_arguments():
    y, s = [0, 1], [0.1, 0.9]
    with pytest.raises(ValueError, match="method"):
        choose_threshold(y, s, method="auc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fpr_target"):
        choose_threshold(y, s, method="fpr", fpr_target=1.5)
    with pytest.raises(ValueError, match="threshold"):
        evaluate_binary(y, s, name="m", threshold=float("nan"))


def _assert_png(path: str | Path) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 1000


def test_evaluate_writes_pngs(tmp_path, random_example):
    y, s = random_example
    report = evaluate_binary(y, s, name="seq", split="test", out_dir=tmp_path / "plots")
    assert report.roc_png == str(tmp_path / "plots" / "seq_test_roc.png")
    assert report.pr_png == str(tmp_path / "plots" / "seq_test_pr.png")
    _assert_png(report.roc_png)
    _assert_png(report.pr_png)


def test_no_pngs_without_out_dir(random_example):
    y, s = random_example
    report = evaluate_binary(y, s, name="m")
    assert report.roc_png is None and report.pr_png is None


def test_plot_comparison_writes_two_pngs(tmp_path, random_example):
    y, s = random_example
    rng = np.random.default_rng(1)
    roc, pr = plot_comparison(
        [("sequence", y, s), ("baseline", y, rng.random(len(y)))], "test", tmp_path
    )
    assert roc == tmp_path / "comparison_test_roc.png"
    assert pr == tmp_path / "comparison_test_pr.png"
    _assert_png(roc)
    _assert_png(pr)


def test_plot_comparison_validates(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        plot_comparison([], "test", tmp_path)
    with pytest.raises(ValueError, match="baseline"):
        plot_comparison([("baseline", [1, 1], [0.1, 0.2])], "test", tmp_path)


def test_plotting_does_not_change_pyplot_backend(tmp_path, random_example):
    import matplotlib

    before = matplotlib.rcParams["backend"]
    y, s = random_example
    evaluate_binary(y, s, name="m", out_dir=tmp_path)
    assert matplotlib.rcParams["backend"] == before


def test_render_eval_report_table_and_images(tmp_path, random_example):
    y, s = random_example
    rng = np.random.default_rng(2)
    seq = evaluate_binary(y, s, name="sequence", threshold=0.5)
    base = evaluate_binary(y, rng.random(len(y)), name="baseline", threshold=0.5)
    roc, pr = plot_comparison([("sequence", y, s)], "test", tmp_path)

    md = render_eval_report([seq, base], title="Fraud eval", images=[roc, pr])

    assert md.startswith("## Fraud eval")
    assert "| metric | sequence | baseline |" in md
    assert f"| ROC AUC | {seq.roc_auc:.4f} | {base.roc_auc:.4f} |" in md
    assert f"| AUPRC (average precision) | {seq.pr_auc:.4f} | {base.pr_auc:.4f} |" in md
    assert f"| positives | {seq.n_positive} | {base.n_positive} |" in md
    assert f"| TP | {seq.confusion[1][1]} | {base.confusion[1][1]} |" in md
    assert md.count("](data:image/png;base64,iVBORw0KGgo") == 2
    assert f"`{roc}`" in md and f"`{pr}`" in md


def test_render_eval_report_mixed_splits_and_pipes():
    common = {
        "n": 10,
        "n_positive": 2,
        "roc_auc": 0.9,
        "pr_auc": 0.5,
        "fpr_target": 0.01,
        "recall_at_fpr": 0.5,
        "threshold": 0.5,
        "precision": 0.5,
        "recall": 0.5,
        "f1": 0.5,
        "confusion": [[7, 1], [1, 1]],
    }
    a = EvalReport(name="a|b", split="val", **common)
    b = EvalReport(name="a|b", split="test", **common)
    md = render_eval_report([a, b], title="t")
    assert r"| metric | a\|b (val) | a\|b (test) |" in md
    assert "_No reports._" in render_eval_report([], title="t")


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("Fraud_Eval/test", "fraud-eval-test"),
        ("ok-key-1", "ok-key-1"),
        ("--A  B--", "a-b"),
    ],
)
def test_artifact_key(raw, key):
    assert artifact_key(raw) == key


def test_artifact_key_rejects_empty():
    with pytest.raises(ValueError):
        artifact_key("__/")


def test_publish_outside_run_context_skips(monkeypatch, caplog):
    def boom(**_: object) -> None:
        raise AssertionError("must not publish outside a run")

    monkeypatch.setattr("prefect.artifacts.create_markdown_artifact", boom)
    with caplog.at_level(logging.INFO, logger=ev.__name__):
        publish_eval_report("## hi", key="Some Key", description="d")
    assert "skipped" in caplog.text


def test_tasks_wrap_plain_functions():
    assert ev.evaluate_binary_task.fn is evaluate_binary
    assert ev.evaluate_binary_task.name == "evaluate-binary"
    assert ev.publish_eval_report_task.fn is publish_eval_report
    assert ev.publish_eval_report_task.name == "publish-eval-report"


def test_nan_error_names_rows():
    with pytest.raises(DataValidationError) as info:
        evaluate_binary(
            [0, 1, 0, 1], [0.1, np.nan, 0.3, np.nan], name="seq", split="val"
        )
    assert info.value.rows == [1, 3]
    assert info.value.column == "y_score"
    assert "seq/val" in str(info.value)
