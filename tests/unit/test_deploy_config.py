"""The operations config, resource specs, and prefect.yaml's pools (no Prefect API needed)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from infra.compute import resolve_training
from infra.deploy import PREFECT_YAML, declared_parameters
from infra.deploy_config import DeployConfigError, load_deploy_config, resource_spec
from infra.resources import IMAGE_HOME, ResourceError, ResourceSpec, trainer_args

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "infra" / "k8s-job-template.json"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def _prefect_yaml() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


def test_every_monitor_trigger_names_a_deployment_of_prefect_yaml() -> None:
    config = load_deploy_config()
    triggers = {spec.trigger for spec in config.monitoring.values() if spec.trigger}
    assert triggers == {"fraud-adapt/on-drift-adapt", "sensor-train/weekly-retrain"}
    for trigger in triggers:
        assert declared_parameters(*trigger.split("/")) is not None, trigger
    assert declared_parameters("fraud-adapt", "on-drift-adapt") == {"source": "accumulated", "old_data": None}
    assert declared_parameters("fraud-adapt", "no-such") is None
    assert config.gpu_pools and "fraud-train" in config.resources


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("resources: {fraud-train: {gpus: 1, gpu_type: a100}}\ngpu_pools: {h100: 2}", "GPU pool 'a100'"),
        ("resources: {fraud-train: {gpu: 1}}", "resources.fraud-train.gpu"),
        ("resources: [", "not valid YAML"),
        ("monitoring: {fraud-monitor: {trigger: fraud-adapt}}", "monitoring.fraud-monitor.trigger"),
        ("timezone: UTC\ndeployments: []", "deployments, timezone moved to prefect.yaml"),
    ],
)
def test_bad_config_names_the_file_and_field(tmp_path: Path, body: str, message: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(DeployConfigError) as err:
        load_deploy_config(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_the_file_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "gpu_pools: {a100: 4}")
    monkeypatch.setenv("INDUSFLOW_DEPLOY_CONFIG", str(path))
    assert load_deploy_config().gpu_pools == {"a100": 4}


def test_trainer_args_fall_back_or_refuse_without_the_gpu(caplog: pytest.LogCaptureFixture) -> None:
    want = ResourceSpec(gpus=2, gpu_type="a100", on_missing_gpu="fallback")
    with caplog.at_level(logging.WARNING):
        args = trainer_args(want, available_gpus=0)
    assert args.accelerator == "cpu" and args.precision == "32-true" and args.fell_back and args.gpu_slots == 0
    assert "asks for 2 GPU(s) of type a100 but the machine has 0" in caplog.text
    with pytest.raises(ResourceError, match="on_missing_gpu"):
        trainer_args(want.model_copy(update={"on_missing_gpu": "refuse"}), available_gpus=1)
    on_gpu = trainer_args(want.model_copy(update={"precision": "bf16-mixed", "strategy": "ddp"}), available_gpus=4)
    assert (on_gpu.accelerator, on_gpu.devices, on_gpu.precision, on_gpu.strategy) == ("gpu", 2, "bf16-mixed", "ddp")
    assert on_gpu.gpu_slots == 2 and on_gpu.concurrency_name == "gpu-a100"
    auto = trainer_args(ResourceSpec(), available_gpus=0)
    assert auto.accelerator == "cpu" and not auto.fell_back


def test_training_reads_the_flow_resource_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "resources: {my-train: {gpus: 1, on_missing_gpu: refuse}, cpu-train: {gpus: 0, precision: 64-true}}")
    monkeypatch.setenv("INDUSFLOW_DEPLOY_CONFIG", str(path))
    assert resource_spec("my-train").on_missing_gpu == "refuse"
    with pytest.raises(ResourceError):
        resolve_training("my-train")
    assert resolve_training("cpu-train").precision == "64-true"
    # an explicit setting for this run wins over the config
    monkeypatch.setenv("INDUSFLOW_TRAIN_ACCELERATOR", "cpu")
    assert resolve_training("my-train").accelerator == "cpu"
    assert resolve_training("no-entry").accelerator == "cpu"


def test_the_kubernetes_pool_of_prefect_yaml_renders_through_the_template_with_and_without_gpus() -> None:
    k8s = {**_prefect_yaml()["definitions"]["work_pools"]["kubernetes"]["job_variables"],
           "image": "img:1", "env": {"INDUSFLOW_HOME": IMAGE_HOME}}
    pod = _render_k8s(k8s)
    container = pod["containers"][0]
    assert container["image"] == "img:1" and "nvidia.com/gpu" not in container["resources"]["limits"]
    assert pod["nodeSelector"] == {}
    gpu_pod = _render_k8s({**k8s, "gpu_count": 2, "gpu_type": "a100"})
    assert gpu_pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert gpu_pod["nodeSelector"] == {"indusflow/gpu-pool": "a100"}


def test_trainings_claim_distinct_cards_of_the_machine() -> None:
    import threading

    from infra.resources import claim_cards

    with claim_cards(1, total=2) as first, claim_cards(1, total=2) as second:
        assert first != second and sorted(first + second) == [0, 1]
        with pytest.raises(ResourceError, match="no 1 free GPU"), claim_cards(1, total=2, timeout_s=0.2, poll_s=0.05):
            pass
        released = threading.Event()

        def wait_for_a_card() -> None:
            with claim_cards(1, total=2, timeout_s=10, poll_s=0.05) as got:
                assert got in ([0], [1])
                released.set()

        waiter = threading.Thread(target=wait_for_a_card)
        waiter.start()
    waiter.join(10)
    assert released.is_set()  # it got a card once the others let go
    with pytest.raises(ResourceError, match="asked for 3"), claim_cards(3, total=2):
        pass


def _render_k8s(variables: dict) -> dict:
    """The pod spec the shipped Kubernetes base job template renders for these variables."""
    from prefect.utilities.templating import apply_values

    template = json.loads(TEMPLATE.read_text())
    declared = template["variables"]["properties"]
    assert set(variables) <= set(declared), "every job variable is declared by the template"
    defaults = {k: v["default"] for k, v in declared.items() if "default" in v}
    rendered = apply_values(template["job_configuration"]["job_manifest"], {**defaults, **variables})
    return rendered["spec"]["template"]["spec"]


def test_container_pools_mount_one_home_at_the_image_home() -> None:
    pools = _prefect_yaml()["definitions"]["work_pools"]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"INDUSFLOW_HOME={IMAGE_HOME}" in dockerfile
    (docker_volume,) = pools["docker"]["job_variables"]["volumes"]
    assert docker_volume.endswith(f":{IMAGE_HOME}")
    pod = _render_k8s({**pools["kubernetes"]["job_variables"], "image": "img:1", "env": {}})
    (volume,) = pod["volumes"]
    (mount,) = pod["containers"][0]["volumeMounts"]
    assert mount == {"name": volume["name"], "mountPath": IMAGE_HOME}
    claim = yaml.safe_load((REPO / "infra" / "k8s" / "home-pvc.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim"
    assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    # both take the runs' environment from the build step, which sets INDUSFLOW_HOME to the image's home
    assert pools["docker"]["job_variables"]["env"] == pools["kubernetes"]["job_variables"]["env"] == \
        "{{ indusflow.container_env }}"
