"""Markdown reports and metric tables of the fraud flows (plain functions, testable)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flows.fraud.results import StageReports
from infra.registry import ModelRef, PromotionDecision
from solutions.fraud.scoring import ValTestScores
from tasks.evaluate import EvalReport, render_eval_report
from tasks.finetune import FreezeReport
from tasks.register import render_promotion
from tasks.tune import StudyReport


def comparison_curves(sequence: ValTestScores, baseline: ValTestScores | None) -> list[tuple[str, object, object]]:
    """``(name, y_test, s_test)`` of the models drawn on one ROC / PR figure."""
    curves: list[tuple[str, object, object]] = [("sequence", sequence.y_test, sequence.s_test)]
    if baseline is not None:
        curves.append(("baseline (HistGB)", baseline.y_test, baseline.s_test))
    return curves


def train_metrics(sequence: EvalReport, baseline: EvalReport | None) -> dict[str, float]:
    """The registered metrics: the sequence model's, and the baseline's under ``baseline/``."""
    extra = {f"baseline/{k}": v for k, v in baseline.metrics().items()} if baseline else {}
    return {**sequence.metrics(), **extra}


def render_train_report(sequence: EvalReport, baseline: EvalReport | None, split: str, images: Sequence[Path],
                        decision: PromotionDecision) -> str:
    """Sequence model vs baseline on the test period, then the champion rule's decision."""
    reports = [r for r in (sequence, baseline) if r is not None]
    body = render_eval_report(reports, title=f"fraud-train: sequence model vs baseline, {split}", images=images)
    return body + "\n\n" + render_promotion(decision)


def adapt_metrics(before: StageReports, after: StageReports) -> dict[str, float]:
    """The adapted version's registered metrics, with the parent's beside them."""
    metrics = {
        **after.new.metrics(),
        "old_test/auprc": after.old.pr_auc,
        "old_test/auprc_before": before.old.pr_auc,
        "test/auprc_before": before.new.pr_auc,
    }
    if after.pattern is not None and before.pattern is not None:
        metrics.update({"pattern/auprc": after.pattern.pr_auc, "pattern/auprc_before": before.pattern.pr_auc})
    return metrics


def render_adapt_report(parent: ModelRef, before: StageReports, after: StageReports, freeze: FreezeReport,
                        split: str, decision: PromotionDecision) -> str:
    """Before/after on the new data, its new pattern and the old test set; the decision."""
    reports = [r for r in (before.new, after.new, before.pattern, after.pattern, before.old, after.old) if r is not None]
    return (
        render_eval_report(reports, title=f"fraud-adapt: {parent.spec} fine-tuned on new data ({split})")
        + f"\n\nTrainable parameters: {freeze.trainable_params} of {freeze.total_params} "
        f"({100 * freeze.trainable_fraction:.1f}%).\n\n"
        + render_promotion(decision)
    )


def render_score_report(summary: str, labelled: EvalReport | None) -> str:
    """The scoring summary, with the labelled rows' metrics when there were labels."""
    return summary + ("\n" + render_eval_report([labelled], title="Labelled rows") if labelled is not None else "")


def render_tune_eval(test: EvalReport, split: str, images: Sequence[Path], decision: PromotionDecision) -> str:
    """The tuned model on the test period, then the champion rule's decision."""
    body = render_eval_report([test], title=f"fraud-tune: best parameters on the test period, {split}", images=images)
    return body + "\n\n" + render_promotion(decision)


def render_tune_report(study: StudyReport, evaluation: str) -> str:
    """The whole tuning report: trials, history, importances, test metrics, decision."""
    return study.markdown + "\n\n" + evaluation

