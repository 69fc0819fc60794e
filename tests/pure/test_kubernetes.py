"""deploy/kubernetes/: every manifest validates against the Kubernetes schema (kubernetes-validate
ships the schemas, so this runs offline), and the manifests fit the code they run: commands the
CLI knows, settings that parse, probes on /healthz and /readyz on the port the process listens
on, selectors that match, a PodDisruptionBudget per component, the operator's PrometheusRule equal
to deploy/prometheus/*.rules.yml. Also the Dockerfile's HEALTHCHECK and compose's healthchecks.

Run as ``python -m tests.pure.test_kubernetes`` it prints the PrometheusRule to regenerate it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from duetime.cli import COMMANDS, build_parser
from duetime.settings import Settings, unknown_variables

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OPERATOR = K8S / "prometheus-operator"
# The oldest Kubernetes release still in upstream support when these were written, and the newest
# schema the validator ships: the manifests use nothing newer or removed.
VERSIONS = ("1.31.0", f"{kubernetes_validate.latest_version()}.0")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _kustomized(folder: Path) -> list[Path]:
    listed = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))["resources"]
    return [folder / name for name in listed]


MANIFESTS = _kustomized(K8S)
OBJECTS = [doc for path in MANIFESTS for doc in _docs(path)]


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [o for o in OBJECTS if o["kind"] == kind]


def _workloads() -> list[dict[str, Any]]:
    return [o for o in OBJECTS if o["kind"] in ("Deployment", "StatefulSet", "Job")]


def test_the_kustomization_lists_every_manifest_in_the_folder() -> None:
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == {p.name for p in MANIFESTS}
    on_disk = {p.name for p in OPERATOR.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == {p.name for p in _kustomized(OPERATOR)}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_against_the_kubernetes_schema(path: Path, version: str) -> None:
    for doc in _docs(path):
        kubernetes_validate.validate(doc, version, strict=True)  # raises on any error


def test_the_validator_does_catch_a_mistake() -> None:
    """Without this, a validator that accepts anything would pass the test above."""
    deployment = yaml.safe_load(yaml.safe_dump(_by_kind("Deployment")[0]))
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
    deployment["spec"]["replicas"] = 2
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_api_engine_worker_and_migrate_run_commands_the_cli_knows() -> None:
    roles = {}
    for obj in _workloads():
        (container,) = obj["spec"]["template"]["spec"]["containers"]
        args = build_parser().parse_args(container["args"])
        assert args.command in COMMANDS
        roles[args.command] = obj["kind"]
        assert getattr(args, "shards", None) is None, "engines deal the shards among themselves"
    assert roles == {"api": "Deployment", "engine": "StatefulSet", "worker": "Deployment", "migrate": "Job"}


def _environment(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            (cm,) = [
                o for o in _by_kind("ConfigMap") if o["metadata"]["name"] == source["configMapRef"]["name"]
            ]
            env.update(cm["data"])
        else:
            (secret,) = [
                o for o in _by_kind("Secret") if o["metadata"]["name"] == source["secretRef"]["name"]
            ]
            env.update(secret["stringData"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", "from-the-pod")
    return env


@pytest.mark.parametrize("index", range(4))
def test_settings_parse_and_probes_use_the_process_port(index: int) -> None:
    obj = _workloads()[index]
    pod = obj["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _environment(container)
    assert unknown_variables(env) == []
    settings = Settings.from_env(env)
    assert settings.run_queue == "nats" and settings.http_host == "0.0.0.0"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "memory" in container["resources"]["limits"] and container["resources"]["requests"]
    if obj["kind"] == "Job":
        return
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace_s
    (port,) = container["ports"]
    assert port["containerPort"] == settings.http_port
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    # /readyz waits up to 5 s for its checks: the probe must wait longer than that
    assert container["readinessProbe"]["timeoutSeconds"] > 5
    if obj["kind"] == "StatefulSet":
        ids = [e for e in container["env"] if e["name"] == "DUETIME_ENGINE_ID"]
        assert ids and ids[0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_services_and_disruption_budgets_select_their_pods() -> None:
    for obj in _workloads():
        if obj["kind"] == "Job":
            continue
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()
        services = [s for s in _by_kind("Service") if s["spec"]["selector"].items() <= labels.items()]
        assert len(services) == 1, obj["metadata"]["name"]
        assert services[0]["spec"]["ports"][0]["targetPort"] == "http"
        budgets = [
            b
            for b in _by_kind("PodDisruptionBudget")
            if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(budgets) == 1, obj["metadata"]["name"]
        if obj["kind"] == "StatefulSet":
            assert obj["spec"]["serviceName"] == services[0]["metadata"]["name"]
            assert services[0]["spec"]["clusterIP"] == "None"


def render_prometheus_rule() -> str:
    groups = [
        group
        for path in sorted((ROOT / "deploy" / "prometheus").glob("*.rules.yml"))
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    ]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "duetime", "labels": {"app.kubernetes.io/part-of": "duetime"}},
        "spec": {"groups": groups},
    }
    header = (
        "# The alerts of deploy/prometheus/*.rules.yml for the Prometheus Operator: the same groups,\n"
        "# word for word (tests/pure/test_kubernetes.py compares them). After changing those files:\n"
        "#   python -m tests.pure.test_kubernetes \\\n"
        "#     > deploy/kubernetes/prometheus-operator/prometheusrule.yaml\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=100)


def test_the_prometheus_rule_is_the_alerts_file() -> None:
    assert (OPERATOR / "prometheusrule.yaml").read_text(encoding="utf-8") == render_prometheus_rule()


def test_the_service_monitor_scrapes_every_component_under_the_alerts_job_names() -> None:
    (monitor,) = _docs(OPERATOR / "servicemonitor.yaml")
    components = monitor["spec"]["selector"]["matchExpressions"][0]["values"]
    for service in _by_kind("Service"):
        assert service["metadata"]["labels"]["app.kubernetes.io/component"] in components
        assert service["spec"]["ports"][0]["name"] == monitor["spec"]["endpoints"][0]["port"]
    (relabel,) = monitor["spec"]["endpoints"][0]["relabelings"]
    assert relabel["targetLabel"] == "job" and relabel["replacement"].startswith("duetime-")


def test_the_image_and_compose_check_health_with_the_healthcheck_module() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    assert 'CMD ["python", "-m", "duetime.healthcheck"]' in dockerfile
    assert "USER 10001" in dockerfile  # numeric, so runAsNonRoot can check it
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    for name, svc in compose["services"].items():
        if svc.get("image") != "duetime:local" or svc["command"][0] == "migrate":
            continue
        assert svc["healthcheck"]["test"] == ["CMD", "python", "-m", "duetime.healthcheck"], name


if __name__ == "__main__":
    print(render_prometheus_rule(), end="")
