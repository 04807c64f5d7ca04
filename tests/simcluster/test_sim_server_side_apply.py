"""Server-side apply in the simulator, as kube-apiserver does it: create, update, conflict, force, dry-run.

Driven through the official client's ApiClient (the generated methods send apply patches the same way), and
through a real `kubectl apply --server-side` where one is installed. Semantics from
https://kubernetes.io/docs/reference/using-api/server-side-apply/.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

APPLY = "application/apply-patch+yaml"
PATH = "/apis/apps/v1/namespaces/default/daemonsets/agent"


def daemonset(image: str = "agent:1", **labels) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "default", "labels": {"app": "agent", **labels}},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "agent", "image": image}]},
            },
        },
    }


@pytest.fixture
def api(kubeconfigs) -> client.ApiClient:
    cfg = type.__call__(client.Configuration)
    config.load_kube_config(config_file=str(kubeconfigs["prod"]), client_configuration=cfg, persist_config=False)
    cfg.retries = False
    return client.ApiClient(cfg)


def call(api: client.ApiClient, method: str, path: str, body=None, **query) -> tuple[int, dict]:
    headers = {"Accept": "application/json", **({"Content-Type": APPLY} if method == "PATCH" else {})}
    response = api.call_api(
        path,
        method,
        query_params=list(query.items()),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    return response.status, json.loads(response.data)


def apply(api, body, manager="gpuaas", **query) -> tuple[int, dict]:
    return call(api, "PATCH", PATH, body, fieldManager=manager, **query)


def owners(obj: dict) -> dict[str, str]:
    return {e["manager"]: e["operation"] for e in obj["metadata"].get("managedFields") or ()}


def test_apply_creates_a_missing_object_and_records_its_manager(api):
    status, obj = apply(api, daemonset())
    assert status == 201
    assert owners(obj) == {"gpuaas": "Apply"}
    fields = obj["metadata"]["managedFields"][0]["fieldsV1"]
    assert fields["f:spec"]["f:template"]["f:spec"]["f:containers"] == {}
    assert call(api, "GET", PATH)[1]["metadata"]["uid"] == obj["metadata"]["uid"]


def test_reapplying_the_same_configuration_changes_nothing(api):
    _, first = apply(api, daemonset())
    status, second = apply(api, daemonset())
    assert status == 200
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert second["metadata"]["managedFields"] == first["metadata"]["managedFields"]


def test_apply_updates_and_removes_fields_the_manager_no_longer_applies(api):
    apply(api, daemonset(tier="gold"))
    _, obj = apply(api, daemonset("agent:2"))
    assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == "agent:2"
    assert obj["metadata"]["labels"] == {"app": "agent"}  # tier was ours and is no longer applied


def test_another_managers_field_with_another_value_is_a_conflict_unless_forced(api):
    apply(api, daemonset(), manager="kubectl")
    with pytest.raises(ApiException) as exc:
        apply(api, daemonset("agent:2"))
    assert exc.value.status == 409
    body = json.loads(exc.value.body)
    assert body["reason"] == "Conflict"
    assert body["message"].startswith('Apply failed with 1 conflict: conflict with "kubectl" using apps/v1:')
    assert body["details"]["causes"] == [
        {
            "type": "FieldManagerConflict",
            "message": 'conflict with "kubectl" using apps/v1',
            "field": ".spec.template.spec.containers",
        }
    ]
    assert call(api, "GET", PATH)[1]["spec"]["template"]["spec"]["containers"][0]["image"] == "agent:1"

    _, obj = apply(api, daemonset("agent:2"), force="true")
    assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == "agent:2"
    took = {e["manager"]: e["fieldsV1"] for e in obj["metadata"]["managedFields"]}
    assert "f:containers" in took["gpuaas"]["f:spec"]["f:template"]["f:spec"]
    assert "f:containers" not in json.dumps(took["kubectl"])


def test_the_same_value_is_shared_not_a_conflict(api):
    apply(api, daemonset(), manager="kubectl")
    status, obj = apply(api, daemonset())
    assert status == 200
    assert owners(obj) == {"kubectl": "Apply", "gpuaas": "Apply"}


def test_an_update_by_another_writer_owns_what_it_changed(api):
    apply(api, daemonset())
    merge = {"metadata": {"labels": {"app": "changed"}}}
    api.call_api(
        PATH,
        "PATCH",
        query_params=[("fieldManager", "kubectl-label")],
        header_params={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
        body=merge,
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    with pytest.raises(ApiException) as exc:
        apply(api, daemonset())
    assert '"kubectl-label"' in json.loads(exc.value.body)["message"]
    assert ".metadata.labels.app" in exc.value.body


def test_dry_run_answers_the_would_be_object_and_stores_nothing(api):
    status, obj = apply(api, daemonset(), dryRun="All")
    assert status == 201 and obj["metadata"]["name"] == "agent"
    with pytest.raises(ApiException) as exc:
        call(api, "GET", PATH)
    assert exc.value.status == 404
    _, stored = apply(api, daemonset())
    _, would = apply(api, daemonset("agent:2"), dryRun="All")
    assert would["spec"]["template"]["spec"]["containers"][0]["image"] == "agent:2"
    now = call(api, "GET", PATH)[1]
    assert now["spec"]["template"]["spec"]["containers"][0]["image"] == "agent:1"
    assert now["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


def test_apply_without_a_field_manager_is_refused(api):
    with pytest.raises(ApiException) as exc:
        call(api, "PATCH", PATH, daemonset())
    assert exc.value.status in (400, 422)


def test_cluster_scoped_rbac_and_admission_kinds_are_served(api):
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
    }
    status, _ = call(api, "PATCH", "/apis/rbac.authorization.k8s.io/v1/clusterroles/reader", role, fieldManager="t")
    assert status == 201
    _, listing = call(api, "GET", "/apis/rbac.authorization.k8s.io/v1")
    assert {r["name"] for r in listing["resources"]} == {"clusterroles", "clusterrolebindings"}
    _, groups = call(api, "GET", "/apis")
    assert {"apps", "admissionregistration.k8s.io"} <= {g["name"] for g in groups["groups"]}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl installed")
def test_kubectl_apply_server_side(kubeconfigs, tmp_path):
    manifest = tmp_path / "ds.json"
    manifest.write_text(json.dumps(daemonset()))

    def kubectl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfigs["prod"]), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    first = kubectl("apply", "--server-side", "-f", str(manifest))
    assert first.returncode == 0, first.stderr
    assert "serverside-applied" in first.stdout
    manifest.write_text(json.dumps(daemonset("agent:2")))
    clash = kubectl("apply", "--server-side", "--field-manager=other", "-f", str(manifest))
    assert clash.returncode != 0
    assert "conflict" in clash.stderr.lower()
    forced = kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", str(manifest))
    assert forced.returncode == 0, forced.stderr
    got = kubectl("get", "daemonset", "agent", "-o", "json")
    assert json.loads(got.stdout)["spec"]["template"]["spec"]["containers"][0]["image"] == "agent:2"
    # kubectl get prints the server's Table (kube-apiserver's default columns for a kind without a printer).
    table = kubectl("get", "daemonsets")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == ["NAME", "CREATED", "AT"]
    assert row.split()[0] == "agent"
    nodes = kubectl("get", "nodes")
    assert nodes.stdout.splitlines()[0].split() == ["NAME", "CREATED", "AT"]
    assert len(nodes.stdout.splitlines()) > 1
