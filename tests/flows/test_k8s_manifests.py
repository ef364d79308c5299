"""Every Kubernetes manifest we ship, and the Job our Kubernetes pool template renders for
prefect.yaml's kubernetes pool, validates against the Kubernetes API schemas (kubernetes-validate, strict:
an unknown or misspelt field is an error). No cluster is needed; the schemas ship with the package."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infra.deploy import PREFECT_YAML

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "infra" / "k8s-job-template.json"
#: The Kubernetes release the manifests are checked against (the schemas are packaged offline).
K8S_VERSION = "1.33.0"


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((REPO / "infra" / "k8s").glob("*.yaml")):
        out += [(f"{path.name}:{d['kind']}/{d['metadata']['name']}", d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


MANIFESTS = _manifests()


def _validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("doc", [d for _, d in MANIFESTS], ids=[n for n, _ in MANIFESTS])
def test_shipped_manifests_validate(doc: dict[str, Any]) -> None:
    _validate(doc)


def test_the_check_catches_a_misspelt_field() -> None:
    (_, deployment), *_ = [(n, d) for n, d in MANIFESTS if d["kind"] == "Deployment"]
    bad = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        _validate(bad)
    pod = deployment["spec"]["template"]["spec"]
    wrong_type = {**deployment, "spec": {**deployment["spec"], "template": {
        **deployment["spec"]["template"], "spec": {**pod, "containers": [{**pod["containers"][0], "ports": 8000}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(wrong_type)


def _rendered_job(variables: dict[str, Any], flow_run: str) -> dict[str, Any]:
    """The Job a Prefect Kubernetes worker submits for these job variables: the template rendered
    with them, then what the worker itself adds (its base fields, the env dict as a list, the
    command as container args when the template leaves them out)."""
    from prefect.utilities.templating import apply_values

    template = json.loads(TEMPLATE.read_text())
    declared = template["variables"]["properties"]
    defaults = {k: v["default"] for k, v in declared.items() if "default" in v}
    base = {"name": flow_run, "namespace": "default", "labels": {"prefect.io/flow-run-name": flow_run},
            "command": "prefect flow-run execute"}
    values = {**defaults, **base, **variables}
    job = apply_values(template["job_configuration"]["job_manifest"], values)
    container = job["spec"]["template"]["spec"]["containers"][0]
    # as prefect-kubernetes' worker does (_populate_env_in_manifest, _populate_command_if_not_present)
    env = values.get("env") or {}
    existing = container.get("env")
    container["env"] = [{"name": k, "value": str(v)} for k, v in env.items()] + (
        existing if isinstance(existing, list) else [])
    args = container.get("args")
    container["args"] = shlex.split(base["command"] if args is None else args) if not isinstance(args, list) else args
    return job


def _pool_variables() -> list[tuple[str, dict[str, Any]]]:
    """prefect.yaml's kubernetes pool, with the environment its build step gives containers, with
    and without the home's volume."""
    from infra.deploy import RUN_ENV
    from infra.resources import IMAGE_HOME

    pool = yaml.safe_load(PREFECT_YAML.read_text())["definitions"]["work_pools"]["kubernetes"]["job_variables"]
    variables = {**pool, "image": "registry.example/indusflow:1", "env": {**RUN_ENV, "INDUSFLOW_HOME": IMAGE_HOME}}
    plain = {k: v for k, v in variables.items() if k not in ("volumes", "volume_mounts")}
    return [("kubernetes", variables), ("kubernetes-no-home", plain)]


def test_the_kubernetes_pool_renders_a_valid_kubernetes_job() -> None:
    for name, variables in _pool_variables():
        job = _rendered_job(variables, f"{name}-run")
        try:
            _validate(job)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"pool {name}: the rendered Job is not valid Kubernetes: {exc}") from exc
        limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert "nvidia.com/gpu" not in limits  # no gpu_count declared: a pod requests no card


def test_a_job_asking_for_gpus_renders_valid_limits_and_node_selector() -> None:
    (_, variables), _ = _pool_variables()
    job = _rendered_job({**variables, "gpu_count": 2, "gpu_type": "a100", "cpu_request": "4",
                         "memory_request": "16384Mi"}, "fraud-train-run")
    _validate(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["nodeSelector"] == {"indusflow/gpu-pool": "a100"}
    assert {"name": "INDUSFLOW_HOME", "value": "/data/indusflow"} in pod["containers"][0]["env"]
