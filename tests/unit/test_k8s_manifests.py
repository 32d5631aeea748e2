"""infra/k8s, the kustomize base: valid against the Kubernetes schemas, and in step with the code.

Each resource the kustomization lists is validated with kubernetes-validate (the Kubernetes
OpenAPI schemas vendored in the package, strict: unknown fields are errors); the ServiceMonitor,
a Prometheus Operator CRD that package has no schema for, against the subset of its CRD schema
the base uses. Then the base is checked against burst itself: every container command parses
against the real CLI, every BURST_* variable is a setting and the ConfigMap's values validate as
:class:`~orchestrator.wiring.Settings`, the probes are the API's public health routes, ports,
selectors and volume names agree, pods run as the image's non-root user, and the policy ConfigMap
is the example it says it is. Each checker is also fed a broken variant, to show it can fail.
With ``kubectl`` on PATH the base is also built with ``kubectl kustomize`` (offline).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from orchestrator.settings_sources import SECRETS_DIR_VAR
from orchestrator.wiring import Settings
from tests.integration.test_api_routes import PUBLIC
from tests.unit.test_infra import SETTING_ENV, check_burst_argv

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "infra" / "k8s"
KUBERNETES_VERSION = "1.30.0"  # the oldest release still in upstream support when this was written
IMAGE_UID = 10001

# The ServiceMonitor fields the base uses, from the monitoring.coreos.com/v1 CRD (strict subset).
SERVICE_MONITOR = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False, "properties": {
                    "matchLabels": {"type": "object",
                                    "additionalProperties": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "required": ["port"],
                    "properties": {
                        "port": {"type": "string"}, "path": {"type": "string"},
                        "interval": {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"},
                        "scrapeTimeout": {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"},
                        "bearerTokenSecret": {
                            "type": "object", "additionalProperties": False,
                            "required": ["name", "key"],
                            "properties": {"name": {"type": "string"}, "key": {"type": "string"}}},
                    }}},
            }},
    },
}


def load_base(base: Path = BASE) -> list[dict]:
    """The resources ``kustomization.yaml`` lists, in order (what kustomize emits, before labels)."""
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((base / name).read_text()) if d]
    return docs


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    """Every pod template's spec, by workload name."""
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"]
            for d in docs if d["kind"] in ("Deployment", "Job")}


def schema_problems(doc: dict) -> list[str]:
    try:
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICE_MONITOR)
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
        return [f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}"]
    return []


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return load_base()


def test_every_resource_is_valid_against_its_schema(docs):
    assert {d["kind"] for d in docs} == {"ConfigMap", "Deployment", "Job", "Service",
                                         "PodDisruptionBudget", "ServiceMonitor"}
    assert [p for d in docs for p in schema_problems(d)] == []
    example_secrets = list(yaml.safe_load_all((BASE / "secret.example.yaml").read_text()))
    assert [p for d in example_secrets for p in schema_problems(d)] == []


@pytest.mark.parametrize("break_it", [
    lambda d: d["Deployment"]["spec"].update(replicas="two"),
    lambda d: d["Deployment"]["spec"]["template"]["spec"]["containers"][0].update(ports=[{"containerPort": "http"}]),
    lambda d: d["Deployment"]["spec"]["template"]["spec"].update(securityContxt={}),  # strict: unknown field
    lambda d: d["ServiceMonitor"]["spec"]["endpoints"][0].update(interval="30 seconds"),
    lambda d: d["ServiceMonitor"]["spec"].update(endpoint=[]),
])
def test_the_schema_check_catches_broken_resources(docs, break_it):
    first = {kind: copy.deepcopy(next(d for d in docs if d["kind"] == kind))
             for kind in ("Deployment", "ServiceMonitor")}
    break_it(first)
    assert sum(len(schema_problems(d)) for d in first.values()) == 1


def test_every_container_runs_a_real_burst_command(docs):
    ran = {}
    for name, spec in pod_specs(docs).items():
        for container in spec["containers"]:
            ran[name] = check_burst_argv(container["command"])[0]
    assert ran == {"burst-api": "api", "burst-worker-control": "worker",
                   "burst-worker-provider": "worker", "burst-beat": "beat",
                   "burst-migrate": "db upgrade"}
    worker = pod_specs(docs)["burst-worker-control"]["containers"][0]["command"]
    assert check_burst_argv(worker)[1]["events"] is True  # task events for Flower
    with pytest.raises(AssertionError):
        check_burst_argv(["burst", "worker", "--event"])


def env_problems(docs: list[dict]) -> list[str]:
    """BURST_* names anywhere in the base that are no setting (nor a *_FILE of one)."""
    known = set(SETTING_ENV) | {f"{e}_FILE" for e in SETTING_ENV}
    problems = []
    for doc in docs:
        for name in re.findall(r"\bBURST_[A-Z0-9_]+\b", json.dumps(doc)):
            if name not in known:
                problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {name} is no setting")
    return problems


def test_every_burst_variable_is_a_setting_and_the_values_validate(docs, monkeypatch, tmp_path):
    secrets = list(yaml.safe_load_all((BASE / "secret.example.yaml").read_text()))
    assert env_problems(docs + secrets) == []
    assert env_problems([{"kind": "ConfigMap", "metadata": {"name": "x"},
                          "data": {"BURST_TICKS": "1"}}]) == ["ConfigMap/x: BURST_TICKS is no setting"]
    settings_map = by_kind(docs, "ConfigMap")["burst-settings"]["data"]
    assert all(isinstance(v, str) for v in settings_map.values()), "ConfigMap values are strings"
    # The pod's environment and its mounted Secret, as the processes will read them.
    for key in list(Settings.model_fields):
        monkeypatch.delenv(f"BURST_{key.upper()}", raising=False)
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir()
    app_secret = by_kind(secrets, "Secret")["burst-secrets"]["stringData"]
    for key, value in app_secret.items():
        (secret_dir / key).write_text(value)
    for key, value in settings_map.items():
        monkeypatch.setenv(key, str(secret_dir) if key == SECRETS_DIR_VAR else value)
    settings = Settings()
    assert settings.secret_key is not None and settings.database_url.startswith("postgresql")
    assert settings.log_format.value == "json"
    # Every policy file it names is a key of the mounted policies ConfigMap.
    policies = by_kind(docs, "ConfigMap")["burst-policies"]["data"]
    mount = "/etc/burst/policies"
    assert {str(p) for p in settings.policy_files} <= {f"{mount}/{k}" for k in policies}
    assert settings_map[SECRETS_DIR_VAR] == "/etc/burst/secrets"


def test_the_policy_configmap_is_the_example_and_loads(docs, tmp_path):
    from orchestrator.policy import load_policy

    policies = by_kind(docs, "ConfigMap")["burst-policies"]["data"]
    for name, text in policies.items():
        assert text == (ROOT / "policies" / "examples" / name).read_text()
        (tmp_path / name).write_text(text)
        load_policy(tmp_path / name)


def test_probes_ports_selectors_and_volumes_agree(docs):
    api = by_kind(docs, "Deployment")["burst-api"]
    container = api["spec"]["template"]["spec"]["containers"][0]
    probes = {kind: container[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
    assert {p["path"] for p in probes.values()} <= PUBLIC  # served without a token
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert all(p["port"] in port_names for p in probes.values())
    settings_map = by_kind(docs, "ConfigMap")["burst-settings"]["data"]
    _, params = check_burst_argv(container["command"])
    assert params["port"] == int(settings_map["BURST_API_PORT"]) == port_names["http"]
    service = by_kind(docs, "Service")["burst-api"]
    pod_labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert all(p["targetPort"] in port_names for p in service["spec"]["ports"])
    monitor = by_kind(docs, "ServiceMonitor")["burst-api"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    deployments = by_kind(docs, "Deployment")
    for pdb in by_kind(docs, "PodDisruptionBudget").values():
        wanted = pdb["spec"]["selector"]["matchLabels"].items()
        assert any(wanted <= d["spec"]["template"]["metadata"]["labels"].items()
                   for d in deployments.values()), f"PDB {pdb['metadata']['name']} selects no pod"
    for d in deployments.values():
        assert d["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    for name, spec in pod_specs(docs).items():
        volumes = {v["name"] for v in spec["volumes"]}
        for c in spec["containers"]:
            assert {m["name"] for m in c["volumeMounts"]} <= volumes, name


def test_pods_run_as_the_images_non_root_user_with_requests(docs):
    dockerfile = (ROOT / "infra" / "Dockerfile").read_text()
    assert f"--uid {IMAGE_UID}" in dockerfile and f"USER {IMAGE_UID}" in dockerfile
    for name, spec in pod_specs(docs).items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == IMAGE_UID, name
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
            # A read-only root: the state dir and /tmp must be writable volumes.
            assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/var/lib/burst", "/tmp"}, name
    beat = by_kind(docs, "Deployment")["burst-beat"]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) not installed")
def test_kubectl_kustomize_builds_the_same_resources(docs):
    built = subprocess.run(["kubectl", "kustomize", str(BASE)], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    rendered = [d for d in yaml.safe_load_all(built) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, rendered)) == sorted(map(key, docs))
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "burst" for d in rendered)
    assert [p for d in rendered for p in schema_problems(d)] == []
