"""The cache keys of the stored-table tasks (tasks/cache.py), computed without a Prefect API."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from prefect.utilities.hashing import hash_objects

from tasks.cache import RunKey, SourceFiles, StoreHome, stored_table_policy
from tasks.data import DatasetRef


def _ref(**update: object) -> DatasetRef:
    ref = DatasetRef(path="/home/x/datasets/t-abc.parquet", content_hash="abc", n_rows=3,
                     columns={"b": "float64", "a": "int64"}, source="t.csv")
    return ref.model_copy(update=update)


def _key(policy, **inputs: object) -> str | None:
    return policy.compute_key(task_ctx=None, inputs=inputs, flow_parameters={})


def test_a_dataset_ref_hashes_by_its_content() -> None:
    assert hash_objects(_ref(), raise_on_failure=True) == hash_objects(_ref(), raise_on_failure=True)
    assert hash_objects(_ref(), raise_on_failure=True) != hash_objects(_ref(content_hash="abd"), raise_on_failure=True)
    policy = stored_table_policy()
    assert _key(policy, ref=_ref()) == _key(policy, ref=_ref())
    assert _key(policy, ref=_ref()) != _key(policy, ref=_ref(content_hash="abd"))


def test_a_changed_input_file_changes_the_key(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    first = _key(SourceFiles(), path=path, n=1)
    assert first is not None and _key(SourceFiles(), path=path, n=1) == first
    path.write_text("a,b\n1,3\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a coarse clock may not move
    assert _key(SourceFiles(), path=path, n=1) != first
    assert _key(SourceFiles(), n=1) is None  # no file among the inputs: no key of its own


def test_another_home_is_another_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "one"))
    one = _key(StoreHome())
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "two"))
    assert _key(StoreHome()) != one


def test_the_build_callable_is_left_out() -> None:
    policy = stored_table_policy("build")
    key = {"data": "abc", "v": "1"}
    assert _key(policy, name="t", key=key, build=lambda: 1) == _key(policy, name="t", key=key, build=lambda: 2)
    assert _key(policy, name="t", key=key, build=None) != _key(policy, name="t", key={**key, "v": "2"}, build=None)


def _task_key(policy, task: str = "train-model", **inputs: object) -> str | None:
    """The key as Prefect computes it inside a run of the task named ``task``."""
    return policy.compute_key(task_ctx=SimpleNamespace(task=SimpleNamespace(name=task)), inputs=inputs,
                              flow_parameters={})


def test_a_training_keys_on_its_task_run_key_and_home_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.cache import training_run_policy
    from tasks.train import TrainSpec

    policy = training_run_policy()
    spec = TrainSpec(run_key="fraud-seq-abc", max_epochs=2)
    # the model and data objects are never hashed: any object goes, the key stays
    assert _task_key(policy, module=object(), datamodule=object(), spec=spec) == _task_key(policy, spec=spec)
    assert _task_key(policy, spec=spec) != _task_key(policy, spec=spec.model_copy(update={"run_key": "fraud-seq-abd"}))
    # a fine-tuning of the same run key returns another result: another key
    assert _task_key(policy, spec=spec) != _task_key(policy, "finetune-model", spec=spec)
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "one"))
    in_one = _task_key(policy, spec=spec)
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "two"))
    assert _task_key(policy, spec=spec) != in_one  # the cached result names checkpoints inside its home
    assert _task_key(RunKey(), module=object()) is None
