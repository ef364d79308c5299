"""The Kubernetes manifest of the API agrees with the settings, the app and the home volume."""

from __future__ import annotations

from pathlib import Path

import yaml

from infra.settings import CoreSettings, ServeSettings

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"


def test_serve_manifest_matches_settings_app_and_volume(tmp_path) -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all((K8S / "serve.yaml").read_text())}
    assert set(docs) == {"Deployment", "Service", "HorizontalPodAutoscaler"}
    deployment, service, hpa = docs["Deployment"], docs["Service"], docs["HorizontalPodAutoscaler"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    known = {f"INDUSFLOW_SERVE_{name.upper()}" for name in ServeSettings.model_fields}
    known |= {f"INDUSFLOW_{name.upper()}" for name in CoreSettings.model_fields}
    for env in container["env"]:
        if env["name"].startswith("INDUSFLOW_"):
            assert env["name"] in known, f"{env['name']} is no setting"
    pvc = yaml.safe_load((K8S / "home-pvc.yaml").read_text())
    (volume,) = pod["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    home = next(e["value"] for e in container["env"] if e["name"] == "INDUSFLOW_HOME")
    assert container["volumeMounts"][0]["mountPath"] == home

    from flows.serve.app import create_app
    from infra.home import HomeLayout

    app = create_app(ServeSettings(), verticals=[], layout=HomeLayout(tmp_path))
    paths = {route.path for route in app.routes}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz" in paths
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" in paths
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu" and container["resources"]["requests"]["cpu"]
