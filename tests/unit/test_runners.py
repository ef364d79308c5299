"""The task runner a run gets from INDUSFLOW_RUNNER_* (nothing is started here; a real Ray cluster
runs in tests/servers/test_ray_runner.py)."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

from infra.errors import IndusflowError
from infra.runners import PROJECT_PACKAGES, make_task_runner, ray_runtime_env


def test_ray_runtime_env_ships_the_code_and_the_settings_but_no_secret(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "sub" / ".." / "home"))
    monkeypatch.setenv("INDUSFLOW_TRAIN_NUM_THREADS", "1")
    monkeypatch.setenv("INDUSFLOW_SERVE_AUDIT_SALT", "pepper-Salt-77")  # a secret setting
    monkeypatch.setenv("INDUSFLOW_LLM_API_KEY", "sk-abcdefabcdefabcdef")
    monkeypatch.setenv("INDUSFLOW_MILVUS_URI", "http://user:pw-Val@milvus:19530")  # a credential in a URL
    monkeypatch.setenv("INDUSFLOW_TUNE_STORAGE_URL", "postgresql://db.internal/studies")  # a URL without one
    env = ray_runtime_env()
    assert [Path(m).name for m in env["py_modules"]] == list(PROJECT_PACKAGES)
    assert all((Path(m) / "__init__.py").is_file() for m in env["py_modules"])
    shared = env["env_vars"]
    assert shared["INDUSFLOW_HOME"] == str((tmp_path / "home").resolve())  # absolute, as the workers need it
    assert shared["INDUSFLOW_TRAIN_NUM_THREADS"] == "1"
    assert shared["INDUSFLOW_TUNE_STORAGE_URL"] == "postgresql://db.internal/studies"
    text = json.dumps(env)
    assert "pepper-Salt-77" not in text and "sk-abcdef" not in text and "pw-Val" not in text
    assert not any(k.startswith(("RAY_", "PREFECT_")) for k in shared)  # the nodes' own business


def test_ray_kind_makes_a_bounded_local_ray_or_joins_the_address(monkeypatch) -> None:
    pytest.importorskip("prefect_ray")
    from prefect_ray import RayTaskRunner

    monkeypatch.setenv("INDUSFLOW_RUNNER_KIND", "ray")
    monkeypatch.setenv("INDUSFLOW_RUNNER_WORKERS", "3")
    local = make_task_runner()
    assert isinstance(local, RayTaskRunner) and local.address is None
    assert local.init_kwargs["num_cpus"] == 3 and local.init_kwargs["include_dashboard"] is False
    assert "runtime_env" in local.init_kwargs
    monkeypatch.setenv("INDUSFLOW_RUNNER_ADDRESS", "ray://head:10001")
    remote = make_task_runner()
    assert remote.address == "ray://head:10001" and "num_cpus" not in remote.init_kwargs
    assert remote.init_kwargs["runtime_env"]["env_vars"]["INDUSFLOW_RUNNER_KIND"] == "ray"


def test_ray_kind_without_prefect_ray_names_the_extra(monkeypatch) -> None:
    real_import = builtins.__import__

    def no_prefect_ray(name, *args, **kwargs):
        if name == "prefect_ray" or name.startswith("prefect_ray."):
            raise ImportError("No module named 'prefect_ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_prefect_ray)
    with pytest.raises(IndusflowError, match=r"pip install 'indusflow\[ray\]'"):
        make_task_runner("ray")
