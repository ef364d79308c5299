"""The deployment config, resource specs and what they map to (no Prefect API needed)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from infra.compute import resolve_training
from infra.deploy_config import DeployConfigError, load_deploy_config, resource_spec
from infra.resources import IMAGE_HOME, HomeVolume, ResourceError, ResourceSpec, job_variables, trainer_args

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "infra" / "k8s-job-template.json"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def test_packaged_config_defines_every_vertical_job() -> None:
    config = load_deploy_config()
    flows = {d.flow for d in config.deployments}
    assert {"flows.fraud:fraud_train", "flows.fraud:fraud_batch_score", "flows.sensor:sensor_batch_score",
            "flows.sensor:sensor_train", "flows.rag:rag_ingest"} <= flows
    on_demand = {"on-drift-adapt", "kb-upload-ingest"}  # started by fraud-monitor and by the KB API, not by a clock
    assert all(d.cron for d in config.deployments if d.name not in on_demand)
    assert config.monitoring["fraud-monitor"].trigger == "fraud-adapt/on-drift-adapt"
    assert config.deployment("fraud-adapt", "on-drift-adapt").parameters["source"] == "accumulated"
    assert config.gpu_pools and "fraud-train" in config.resources


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("deployments: [{name: a, flow: 'x:y', cron: '61 * * * *'}]", "cron '61 * * * *'"),
        ("timezone: Mars/Olympus\ndeployments: []", "unknown time zone 'Mars/Olympus'"),
        ("deployments: [{name: Bad_Name, flow: 'x:y'}]", "deployments.0.name"),
        ("deployments: [{name: a, flow: 'not an entrypoint'}]", "package.module:function"),
        ("resources: {fraud-train: {gpus: 1, gpu_type: a100}}\ngpu_pools: {h100: 2}", "GPU pool 'a100'"),
        ("resources: {fraud-train: {gpu: 1}}", "resources.fraud-train.gpu"),
        ("deployments: [", "not valid YAML"),
        ("home_volume: {docker: 'my volume'}", "home_volume.docker"),
        ("home_volume: {kubernetes: Home_Claim}", "home_volume.kubernetes"),
        ("home_volume: {kubernetes: home, mount_path: data/home}", "home_volume.mount_path"),
        ("home_volume: {nfs: server:/export}", "home_volume.nfs"),
    ],
)
def test_bad_config_names_the_file_and_field(tmp_path: Path, body: str, message: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(DeployConfigError) as err:
        load_deploy_config(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_timezone_and_file_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "timezone: UTC\ndeployments: [{name: a, flow: 'flows.fraud:fraud_train', cron: '0 2 * * *'}]")
    monkeypatch.setenv("INDUSFLOW_DEPLOY_CONFIG", str(path))
    monkeypatch.setenv("INDUSFLOW_DEPLOY_TIMEZONE", "Asia/Shanghai")
    config = load_deploy_config()
    assert config.timezone == "Asia/Shanghai" and [d.name for d in config.deployments] == ["a"]


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


def test_job_variables_per_pool_type_match_the_templates() -> None:
    spec = ResourceSpec(gpus=2, gpu_type="a100", cpus=4, memory_gb=16)
    process = job_variables(spec, "process", env={"A": "1"})
    assert process == {"env": {"A": "1", "OMP_NUM_THREADS": "4", "INDUSFLOW_TRAIN_NUM_THREADS": "4"}}
    docker = job_variables(spec, "docker", image="img:1")
    assert docker["image"] == "img:1" and docker["mem_limit"] == "16384m"
    assert docker["container_create_kwargs"]["device_requests"][0]["Count"] == 2
    k8s = job_variables(spec, "kubernetes", image="img:1")
    assert k8s["gpu_count"] == 2 and k8s["gpu_type"] == "a100" and k8s["cpu_request"] == "4" and k8s["memory_request"] == "16384Mi"
    # every variable we set is declared by the shipped Kubernetes base job template, and the
    # template renders a GPU request only when one is asked for
    from prefect.utilities.templating import apply_values

    template = json.loads(TEMPLATE.read_text())
    declared = set(template["variables"]["properties"])
    assert set(k8s) <= declared
    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    rendered = apply_values(template["job_configuration"]["job_manifest"], {**defaults, **k8s})
    container = rendered["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2 and container["image"] == "img:1"
    assert rendered["spec"]["template"]["spec"]["nodeSelector"] == {"indusflow/gpu-pool": "a100"}
    cpu_only = apply_values(template["job_configuration"]["job_manifest"], {**defaults, "image": "img:1"})
    cpu_container = cpu_only["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in cpu_container["resources"]["limits"]
    assert cpu_only["spec"]["template"]["spec"]["nodeSelector"] == {}


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


def test_home_volume_is_mounted_at_the_image_home_by_docker_and_kubernetes_pools(tmp_path: Path) -> None:
    path = _write(tmp_path, "home_volume: {docker: shared-home, kubernetes: indusflow-home}")
    home = load_deploy_config(path).home_volume
    assert home == HomeVolume(docker="shared-home", kubernetes="indusflow-home", mount_path=IMAGE_HOME)
    spec = ResourceSpec(cpus=2)

    docker = job_variables(spec, "docker", image="img:1", home=home)
    assert docker["volumes"] == [f"shared-home:{IMAGE_HOME}"]
    assert docker["env"]["INDUSFLOW_HOME"] == IMAGE_HOME

    k8s = job_variables(spec, "kubernetes", image="img:1", home=home)
    assert k8s["env"]["INDUSFLOW_HOME"] == IMAGE_HOME
    pod = _render_k8s(k8s)
    (volume,) = pod["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": "indusflow-home"}
    (mount,) = pod["containers"][0]["volumeMounts"]
    assert mount == {"name": volume["name"], "mountPath": IMAGE_HOME}

    # a process pool runs on the host: no volume, its own INDUSFLOW_HOME
    assert job_variables(spec, "process", home=home) == {
        "env": {"OMP_NUM_THREADS": "2", "INDUSFLOW_TRAIN_NUM_THREADS": "2"}
    }
    # only the kubernetes claim set: docker runs keep their own home
    only_k8s = HomeVolume(kubernetes="indusflow-home")
    assert "volumes" not in job_variables(spec, "docker", image="img:1", home=only_k8s)


def test_without_a_home_volume_nothing_is_mounted(tmp_path: Path) -> None:
    config = load_deploy_config(_write(tmp_path, "deployments: []"))
    assert config.home_volume is None
    docker = job_variables(ResourceSpec(), "docker", image="img:1", home=config.home_volume)
    assert "volumes" not in docker and "INDUSFLOW_HOME" not in docker.get("env", {})
    k8s = job_variables(ResourceSpec(), "kubernetes", image="img:1", home=config.home_volume)
    assert "volumes" not in k8s and "volume_mounts" not in k8s
    pod = _render_k8s(k8s)
    assert "volumes" not in pod and "volumeMounts" not in pod["containers"][0]


def test_shipped_home_volume_matches_the_image_and_the_claim_manifest() -> None:
    import yaml

    home = load_deploy_config().home_volume
    assert home is not None and home.docker and home.kubernetes
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"INDUSFLOW_HOME={IMAGE_HOME}" in dockerfile and home.mount_path == IMAGE_HOME
    claim = yaml.safe_load((REPO / "infra" / "k8s" / "home-pvc.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["name"] == home.kubernetes
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
