"""Publishing an evaluation report as a Prefect markdown artifact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from tasks.evaluate import (
    EvalReport,
    evaluate_binary_task,
    plot_comparison,
    publish_eval_report_task,
    render_eval_report,
)


@flow(name="evaluate-artifact-test")
def _eval_flow(out_dir: Path, key: str) -> tuple[EvalReport, EvalReport, str]:
    rng = np.random.default_rng(0)
    y = (rng.random(200) < 0.3).astype(int)
    seq_score = rng.normal(size=200) + 1.5 * y
    base_score = rng.normal(size=200) + 0.5 * y
    seq = evaluate_binary_task(y, seq_score, name="sequence", threshold=0.5)
    base = evaluate_binary_task(y, base_score, name="baseline", threshold=0.5)
    images = plot_comparison(
        [("sequence", y, seq_score), ("baseline", y, base_score)], "test", out_dir
    )
    markdown = render_eval_report([seq, base], title="Eval test", images=images)
    publish_eval_report_task(markdown, key=key, description="evaluation report")
    return seq, base, markdown


def _read_artifacts(key: str):
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )


def test_flow_publishes_markdown_artifact(tmp_path):
    seq, base, markdown = _eval_flow(tmp_path, key="Eval_Report/Test")

    artifacts = _read_artifacts("eval-report-test")  # the sanitised key

    assert len(artifacts) == 1
    artifact = artifacts[0]
    assert artifact.type == "markdown"
    assert artifact.description == "evaluation report"
    assert artifact.task_run_id is not None  # created inside the publish task
    assert artifact.data == markdown
    assert "| metric | sequence | baseline |" in artifact.data
    assert f"| ROC AUC | {seq.roc_auc:.4f} | {base.roc_auc:.4f} |" in artifact.data
    assert artifact.data.count("data:image/png;base64,") == 2
