"""deploy/: every manifest the kustomization lists is valid Kubernetes 1.34 and keeps gpuaas's invariants.

The kustomization is plain (a resources list and an image tag), so rendering it is loading each listed
file; kubernetes-validate checks each document against the 1.34 OpenAPI schemas, strictly (unknown
fields refused). The ServiceMonitor is a CRD kubernetes-validate has no schema for: its fields are
checked here against the Prometheus Operator's ServiceMonitor API (monitoring.coreos.com/v1,
prometheus-operator Documentation/api-reference/api.md: Endpoint.port/path/interval/scrapeTimeout,
SafeAuthorization.type/credentials as a SecretKeySelector).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from celery.utils.imports import symbol_by_name
from cryptography.fernet import Fernet
from django.conf import settings
from django.urls import resolve
from redbeat import RedBeatScheduler

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.34.0"
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
WORKLOADS = ("Deployment", "DaemonSet", "Job")
# Settings that are secrets: only ever read from a Secret, never written in a manifest.
SECRET_SETTINGS = {
    "SECRET_KEY",
    "CREDENTIALS_KEYS",
    "CREDENTIALS_KEY",
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "CACHE_URL",
    "REDIS_URL",
    "MONITORING_METRICS_TOKEN",
    "AGENT_SIGNING_SECRET",
    "AGENT_NODE_KEY",
}
PINNED = re.compile(r"^[^:@\s]+(:(?!latest$)[\w][\w.-]*)?(@sha256:[0-9a-f]{64})?$")


def kustomization() -> dict:
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def render() -> list[tuple[str, dict]]:
    """(file, document) for every document of every file the kustomization lists, in order."""
    docs = []
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc:
                docs.append((name, doc))
    return docs


DOCS = render()


def of_kind(*kinds: str) -> list[dict]:
    return [doc for _, doc in DOCS if doc["kind"] in kinds]


def named(kind: str, name: str) -> dict:
    return next(doc for doc in of_kind(kind) if doc["metadata"]["name"] == name)


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict) -> list[dict]:
    spec = pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


def ident(doc: dict) -> str:
    return f"{doc['kind']}/{doc['metadata'].get('namespace', '-')}/{doc['metadata']['name']}"


@pytest.mark.parametrize(("source", "doc"), DOCS, ids=[f"{f}:{ident(d)}" for f, d in DOCS])
def test_each_document_is_valid_kubernetes_1_34(source, doc):
    if (doc["apiVersion"], doc["kind"]) in CRDS:
        pytest.skip("a CRD: no schema in kubernetes-validate; test_service_monitor checks its fields")
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_manifest_is_listed_except_the_secret_example():
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk - listed == {"secret.example.yaml"}
    assert listed <= on_disk


def test_no_secret_values_anywhere():
    assert of_kind("Secret") == [], "Secrets are created by hand (docs/deploying.md), never shipped"
    for doc in of_kind("ConfigMap"):
        assert not SECRET_SETTINGS & set(doc.get("data", {})), ident(doc)
    for workload in of_kind(*WORKLOADS):
        for container in containers(workload):
            for env in container.get("env", []):
                if env["name"] in SECRET_SETTINGS:
                    assert "secretKeyRef" in env.get("valueFrom", {}), f"{ident(workload)}: {env['name']}"


def test_every_container_is_pinned_limited_and_read_only():
    for workload in of_kind(*WORKLOADS):
        spec = pod_spec(workload)
        for container in containers(workload):
            where = f"{ident(workload)}/{container['name']}"
            assert PINNED.match(container["image"]) and ":" in container["image"], where
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where
            security = container.get("securityContext", {})
            assert security.get("readOnlyRootFilesystem") is True, where
            assert security.get("privileged") in (None, False), where
            assert "ALL" in security.get("capabilities", {}).get("drop", []), where
            if workload["metadata"]["name"] == "gpuaas-node-agent":
                continue  # the one documented exception: test_node_agent_has_exactly_its_privileges
            assert spec["securityContext"].get("runAsNonRoot") is True, where
            assert spec["securityContext"].get("runAsUser", 0) != 0, where
            assert security.get("allowPrivilegeEscalation") is False, where
            assert not security.get("capabilities", {}).get("add"), where
        assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), ident(workload)
    assert re.match(r"^\d", str(kustomization()["images"][0]["newTag"])), "kustomization: pin a release tag"


def test_beat_is_an_active_and_a_standby_on_two_nodes():
    """Two beats are safe only with redbeat's lock: named on the command line, not left to the environment."""
    beats = [w for w in of_kind(*WORKLOADS) for c in containers(w) if "beat" in c.get("command", [])]
    assert [ident(w) for w in beats] == ["Deployment/gpuaas/gpuaas-beat"]
    (beat,) = beats
    assert beat["spec"]["replicas"] == 2
    assert beat["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    (container,) = pod_spec(beat)["containers"]
    command = container["command"]
    assert command[command.index("--scheduler") + 1] == "redbeat.RedBeatScheduler"
    assert symbol_by_name("redbeat.RedBeatScheduler") is RedBeatScheduler
    labels = beat["spec"]["template"]["metadata"]["labels"]
    (term,) = pod_spec(beat)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == beat["spec"]["selector"]["matchLabels"]
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    budget = named("PodDisruptionBudget", "gpuaas-beat")
    assert budget["spec"]["maxUnavailable"] == 1


def test_the_beat_pods_environment_selects_redbeat(tmp_path):
    """With the deployment's Redis broker, settings pick redbeat and a lock that a standby outlasts."""
    (container,) = pod_spec(named("Deployment", "gpuaas-beat"))["containers"]
    script = (
        "import django; django.setup(); from django.conf import settings as s; print(s.CELERY_BEAT_SCHEDULER, "
        "s.REDBEAT_REDIS_URL, s.CELERY_BEAT_MAX_LOOP_INTERVAL, s.REDBEAT_LOCK_TIMEOUT)"
    )
    result = run_python(deploy_env(container), tmp_path, "-c", script)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["redbeat.RedBeatScheduler", "redis://redis.invalid:6379/0", "5", "20"]


def test_a_worker_deployment_for_every_queue():
    queues = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()} | {settings.CELERY_TASK_DEFAULT_QUEUE}
    served = set()
    for deployment in of_kind("Deployment"):
        command = deployment["spec"]["template"]["spec"]["containers"][0].get("command", [])
        if "worker" in command:
            served.update(command[command.index("--queues") + 1].split(","))
    assert served == queues


def test_web_probes_hit_the_health_endpoints():
    (web,) = named("Deployment", "gpuaas-web")["spec"]["template"]["spec"]["containers"]
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert resolve("/readyz").url_name == "readyz"
    assert resolve("/healthz").url_name == "healthz"
    assert web["command"][:2] == ["gunicorn", "gpuaas.wsgi:application"]


def test_node_agent_has_exactly_its_privileges():
    agent = named("DaemonSet", "gpuaas-node-agent")
    spec = pod_spec(agent)
    (container,) = spec["containers"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["automountServiceAccountToken"] is False
    assert container["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
    }
    env = {e["name"]: e for e in container["env"]}
    assert env["AGENT_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert {k: env[k]["value"] for k in env if k.startswith("NVIDIA_")} == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
        "NVIDIA_MIG_CONFIG_DEVICES": "all",
        "NVIDIA_MIG_MONITOR_DEVICES": "all",
    }
    assert "node.$${AGENT_CLUSTER_NAME}.$${AGENT_NODE_NAME}" in container["command"][2]
    assert "DATABASE_URL" not in env and container["envFrom"] == [{"configMapRef": {"name": "gpuaas-agent-config"}}]
    config = named("ConfigMap", "gpuaas-agent-config")["data"]
    assert config["GPUAAS_ROLE"] == "node-agent"
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] == "agent-key")
    # The kubelet's PodResources socket directory, read-only, and nothing else of the kubelet's.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["pod-resources"] == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    host_paths = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {
        "agent-key": {"path": "/etc/gpuaas", "type": "Directory"},
        "pod-resources": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"},
    }
    assert config.get("PODRESOURCES_SOCKET", "/var/lib/kubelet/pod-resources/kubelet.sock") == (
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )


def test_pod_disruption_budgets_cover_every_replicated_deployment():
    budgets = of_kind("PodDisruptionBudget")
    for deployment in of_kind("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        if deployment["spec"]["replicas"] > 1:
            assert len(covering) == 1, ident(deployment)
        else:
            assert covering == [], f"{ident(deployment)}: a budget on a single pod blocks every drain"


def test_only_processes_that_call_kubernetes_get_a_token():
    controller = {
        "gpuaas-web",
        "gpuaas-worker-default",
        "gpuaas-worker-discovery",
        "gpuaas-worker-metrics",
    }
    for workload in of_kind(*WORKLOADS):
        account = pod_spec(workload)["serviceAccountName"]
        expected = "gpuaas-controller" if workload["metadata"]["name"] in controller else account
        assert account == expected, ident(workload)
        if account != "gpuaas-controller":
            sa = next(d for d in of_kind("ServiceAccount") if d["metadata"]["name"] == account)
            assert sa["automountServiceAccountToken"] is False, ident(workload)
    binding = named("ClusterRoleBinding", "gpuaas-controller")
    assert binding["roleRef"]["name"] == named("ClusterRole", "gpuaas-controller")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuaas-controller", "namespace": "gpuaas"}]


def test_node_agents_reach_only_redis_and_dns():
    policies = [d for d in of_kind("NetworkPolicy") if d["metadata"]["namespace"] == "gpuaas-agent"]
    ports = {
        (port["port"], port["protocol"])
        for policy in policies
        for rule in policy["spec"].get("egress", [])
        for port in rule.get("ports", [])
    }
    assert ports == {(6379, "TCP"), (53, "UDP"), (53, "TCP")}
    assert not any(policy["spec"].get("ingress") for policy in policies)
    assert {p["metadata"]["name"] for p in policies} >= {"default-deny"}


def test_service_monitor():
    monitor = named("ServiceMonitor", "gpuaas-web")
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "authorization"}
    assert endpoint["path"] == "/metrics" and resolve("/metrics").url_name == "metrics"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "gpuaas-metrics-token", "key": "token"},
    }
    service = named("Service", "gpuaas-web")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    for field in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"\d+(ms|s|m|h)", endpoint[field]), field


def test_secret_example_names_what_the_manifests_reference():
    example = {d["metadata"]["name"]: d for d in yaml.safe_load_all((DEPLOY / "secret.example.yaml").read_text())}
    referenced = set()
    for workload in of_kind(*WORKLOADS):
        for container in containers(workload):
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    referenced.add((source["secretRef"]["name"], None))
            for env in container.get("env", []):
                if ref := env.get("valueFrom", {}).get("secretKeyRef"):
                    referenced.add((ref["name"], ref["key"]))
    referenced.add(("gpuaas-metrics-token", "token"))
    for name, key in referenced:
        assert name in example, name
        assert key is None or key in example[name]["stringData"], (name, key)


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion ($$ is a literal $; an unknown name is left as written)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), value)


def deploy_env(container: dict | None = None) -> dict[str, str]:
    """The ConfigMap and `container`'s env, with stand-in secrets (DEBUG off)."""
    env = dict(named("ConfigMap", "gpuaas-config")["data"])
    env.update(
        SECRET_KEY="s" * 60,
        CREDENTIALS_KEYS=Fernet.generate_key().decode(),
        DATABASE_URL="postgres://gpuaas@db.invalid:5432/gpuaas",
        CELERY_BROKER_URL="redis://redis.invalid:6379/0",
        MONITORING_METRICS_TOKEN="t" * 40,
        POD_IP="10.1.2.3",
    )
    for item in (container or {}).get("env", []):
        if "value" in item:
            env[item["name"]] = _expand(item["value"], env)
    return env


def run_python(env: dict[str, str], tmp_path, *args: str) -> subprocess.CompletedProcess:
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return subprocess.run(
        [sys.executable, *args],
        cwd=DEPLOY.parent,
        env={**keep, **env, "GPUAAS_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "gpuaas.settings"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_web_pods_environment_passes_manage_py_check(tmp_path):
    """The ConfigMap and the container's env, with stand-in secrets, are accepted by settings (DEBUG off)."""
    (web,) = named("Deployment", "gpuaas-web")["spec"]["template"]["spec"]["containers"]
    env = deploy_env(web)
    assert env["ALLOWED_HOSTS"] == "gpuaas.example.com,10.1.2.3"
    result = run_python(env, tmp_path, "manage.py", "check", "--fail-level", "ERROR")
    assert result.returncode == 0, result.stdout + result.stderr
