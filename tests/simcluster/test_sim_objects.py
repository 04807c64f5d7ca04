"""Namespaces, pods (scheduling, eviction), configmaps and resourcequotas through the official client."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from simcluster.scheduler import assigned_devices


def gpu_pod(name: str, resource: str, count: int = 1, **spec) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {resource: str(count)}}}],
            **spec,
        },
    }


def status_of(exc: pytest.ExceptionInfo) -> dict:
    return json.loads(exc.value.body)


# --- namespaces --------------------------------------------------------------------------


def test_namespace_lifecycle(prod):
    created = prod.create_namespace({"metadata": {"name": "team-x", "labels": {"a": "b"}}})
    assert created.status.phase == "Active"
    assert created.metadata.labels == {"a": "b", "kubernetes.io/metadata.name": "team-x"}
    patched = prod.patch_namespace("team-x", {"metadata": {"annotations": {"owner": "ops"}}})
    assert patched.metadata.annotations == {"owner": "ops"}
    assert "team-x" in [n.metadata.name for n in prod.list_namespace().items]
    prod.create_namespaced_config_map("team-x", {"metadata": {"name": "cfg"}, "data": {"k": "v"}})
    prod.delete_namespace("team-x")
    with pytest.raises(ApiException) as exc:
        prod.read_namespace("team-x")
    assert exc.value.status == 404
    with pytest.raises(ApiException) as exc:
        prod.read_namespaced_config_map("cfg", "team-x")
    assert exc.value.status == 404


def test_duplicate_namespace_is_409_already_exists(prod):
    with pytest.raises(ApiException) as exc:
        prod.create_namespace({"metadata": {"name": "team-nlp"}})
    assert exc.value.status == 409
    assert status_of(exc)["reason"] == "AlreadyExists"
    assert status_of(exc)["details"] == {"name": "team-nlp", "kind": "namespaces"}


def test_invalid_namespace_name_is_422(prod):
    with pytest.raises(ApiException) as exc:
        prod.create_namespace({"metadata": {"name": "Team_X"}})
    assert exc.value.status == 422
    body = status_of(exc)
    assert body["reason"] == "Invalid"
    assert body["details"]["kind"] == "Namespace"
    assert body["details"]["causes"][0]["field"] == "metadata.name"


def test_create_in_missing_namespace_is_404(prod):
    with pytest.raises(ApiException) as exc:
        prod.create_namespaced_config_map("nowhere", {"metadata": {"name": "cfg"}})
    assert exc.value.status == 404
    assert status_of(exc)["message"] == 'namespaces "nowhere" not found'


# --- pods ----------------------------------------------------------------------------------


def test_demo_pods_are_running_with_devices_the_kubelet_assigned(prod, state):
    pods = prod.list_pod_for_all_namespaces().items
    assert [(p.metadata.namespace, p.metadata.name) for p in pods] == [
        ("team-nlp", "llm-train-0"),
        ("team-nlp", "llm-train-1"),
        ("team-vision", "detector"),
        ("team-vision", "segmenter"),
        ("team-vision", "tracker"),
    ]
    assert {p.status.phase for p in pods} == {"Running"}
    train = pods[0]
    assert train.spec.node_selector == {"gpuaas.io/tier": "full"}  # from the namespace annotation
    devices = assigned_devices(state.cluster("prod"), "team-nlp", "llm-train-0")
    assert len(devices) == 2 and all(d.startswith("GPU-") for d in devices)
    (detector,) = assigned_devices(state.cluster("prod"), "team-vision", "detector")
    assert detector.startswith("MIG-")
    # As on a real node, the pod itself does not say which devices it got (only PodResources does).
    assert not any("gpuaas.io/device-ids" in (p.metadata.annotations or {}) for p in pods)


def test_field_selectors_on_pods(prod):
    on_node = prod.list_pod_for_all_namespaces(field_selector="spec.nodeName=prod-h100-full-01").items
    assert sorted(p.metadata.name for p in on_node) == ["llm-train-0", "llm-train-1"]
    running = prod.list_namespaced_pod("team-vision", field_selector="status.phase=Running").items
    assert len(running) == 3
    assert prod.list_namespaced_pod("team-vision", field_selector="status.phase!=Running").items == []
    labelled = prod.list_pod_for_all_namespaces(label_selector="app=detector").items
    assert [p.metadata.name for p in labelled] == ["detector"]


def test_pod_scheduled_pending_and_retried_when_devices_free_up(prod):
    prod.create_namespace({"metadata": {"name": "batch"}})
    # 12 x 4g.40gb in the cluster (GPUs 0-5 of the tier-2 nodes), one taken by team-vision/segmenter on -01.
    fits = prod.create_namespaced_pod("batch", gpu_pod("big", "nvidia.com/mig-4g.40gb", 6))
    assert (fits.status.phase, fits.spec.node_name) == ("Running", "prod-h100-4g3g-02")
    pending = prod.create_namespaced_pod("batch", gpu_pod("wait", "nvidia.com/mig-4g.40gb", 6))
    assert pending.status.phase == "Pending"
    assert pending.spec.node_name is None
    condition = pending.status.conditions[0]
    assert (condition.type, condition.status, condition.reason) == ("PodScheduled", "False", "Unschedulable")
    assert "Insufficient nvidia.com/mig-4g.40gb" in condition.message
    prod.delete_namespaced_pod("big", "batch")
    retried = prod.read_namespaced_pod("wait", "batch")
    assert (retried.status.phase, retried.spec.node_name) == ("Running", "prod-h100-4g3g-02")


def test_node_selector_and_cordon_respected(prod):
    prod.create_namespace({"metadata": {"name": "batch"}})
    prod.patch_node("prod-h100-bal-01", {"spec": {"unschedulable": True}})
    pod = prod.create_namespaced_pod(
        "batch", gpu_pod("p", "nvidia.com/mig-2g.20gb", 1, nodeSelector={"gpuaas.io/tier": "1"})
    )
    assert pod.spec.node_name == "prod-h100-bal-02"


def test_namespace_selector_conflict_is_403(prod):
    with pytest.raises(ApiException) as exc:
        prod.create_namespaced_pod("team-nlp", gpu_pod("x", "nvidia.com/gpu", 1, nodeSelector={"gpuaas.io/tier": "1"}))
    assert exc.value.status == 403
    assert "conflicts with its namespace node label selector" in status_of(exc)["message"]


def test_delete_and_evict_pods_free_their_devices(prod, state):
    node = state.cluster("prod").nodes["prod-h100-full-01"]
    assert len(node.assigned) == 4
    deleted = prod.delete_namespaced_pod("llm-train-0", "team-nlp")
    assert deleted.metadata.deletion_timestamp is not None
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="llm-train-1", namespace="team-nlp"))
    prod.create_namespaced_pod_eviction("llm-train-1", "team-nlp", eviction)
    assert prod.list_namespaced_pod("team-nlp").items == []
    assert node.assigned == {}
    with pytest.raises(ApiException) as exc:
        prod.create_namespaced_pod_eviction("llm-train-1", "team-nlp", eviction)
    assert exc.value.status == 404


def test_pod_spec_is_immutable(prod):
    with pytest.raises(ApiException) as exc:
        prod.patch_namespaced_pod("detector", "team-vision", {"spec": {"nodeName": "elsewhere"}})
    assert exc.value.status == 422
    labelled = prod.patch_namespaced_pod("detector", "team-vision", {"metadata": {"labels": {"x": "y"}}})
    assert labelled.metadata.labels["x"] == "y"


def test_time_sliced_pods_get_replica_ids_spread_over_gpus(dev, state):
    pods = dev.list_namespaced_pod("team-research").items
    (ids,) = zip(*(assigned_devices(state.cluster("dev"), "team-research", p.metadata.name) for p in pods), strict=True)
    assert all(i.endswith("::0") for i in ids)
    assert len({i.split("::")[0] for i in ids}) == 3  # three different physical GPUs


# --- configmaps ----------------------------------------------------------------------------


def test_configmap_create_replace_patch_delete(prod):
    ns = "team-vision"
    created = prod.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    assert created.metadata.resource_version
    created.data["b"] = "2"
    replaced = prod.replace_namespaced_config_map("cfg", ns, created)
    assert replaced.data == {"a": "1", "b": "2"}
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    with pytest.raises(ApiException) as exc:  # created still carries the old resourceVersion
        prod.replace_namespaced_config_map("cfg", ns, created)
    assert exc.value.status == 409
    assert status_of(exc)["reason"] == "Conflict"
    patched = prod.patch_namespaced_config_map("cfg", ns, {"data": {"a": None, "c": "3"}})
    assert patched.data == {"b": "2", "c": "3"}
    listed = prod.list_namespaced_config_map(ns, label_selector="")
    assert [c.metadata.name for c in listed.items] == ["cfg"]
    status = prod.delete_namespaced_config_map("cfg", ns)
    assert status.status == "Success"
    with pytest.raises(ApiException) as exc:
        prod.delete_namespaced_config_map("cfg", ns)
    assert exc.value.status == 404


def test_configmap_bad_key_is_422(prod):
    with pytest.raises(ApiException) as exc:
        prod.create_namespaced_config_map("team-vision", {"metadata": {"name": "cfg"}, "data": {"bad key": "x"}})
    assert exc.value.status == 422


# --- resource quotas -----------------------------------------------------------------------


def test_quota_status_and_enforcement(prod):
    quota = prod.read_namespaced_resource_quota("gpu-quota", "team-nlp")
    assert quota.status.hard == {"requests.nvidia.com/gpu": "8"}
    assert quota.status.used == {"requests.nvidia.com/gpu": "4"}
    with pytest.raises(ApiException) as exc:
        prod.create_namespaced_pod("team-nlp", gpu_pod("greedy", "nvidia.com/gpu", 5))
    assert exc.value.status == 403
    body = status_of(exc)
    assert body["reason"] == "Forbidden"
    assert body["message"] == (
        'pods "greedy" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=5, '
        "used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=8"
    )
    assert [p.metadata.name for p in prod.list_namespaced_pod("team-nlp").items] == ["llm-train-0", "llm-train-1"]
    ok = prod.create_namespaced_pod("team-nlp", gpu_pod("fits", "nvidia.com/gpu", 4))
    assert ok.status.phase == "Running"


def test_quota_crud(prod):
    ns = "team-vision"
    prod.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "extra"}, "spec": {"hard": {"requests.nvidia.com/mig-2g.20gb": "1"}}}
    )
    replaced = prod.replace_namespaced_resource_quota(
        "extra", ns, {"metadata": {"name": "extra"}, "spec": {"hard": {"requests.nvidia.com/mig-2g.20gb": "3"}}}
    )
    assert replaced.spec.hard == {"requests.nvidia.com/mig-2g.20gb": "3"}
    patched = prod.patch_namespaced_resource_quota("extra", ns, {"spec": {"hard": {"pods": "10"}}})
    assert patched.status.used == {"requests.nvidia.com/mig-2g.20gb": "0", "pods": "3"}
    assert len(prod.list_resource_quota_for_all_namespaces().items) == 3
    prod.delete_namespaced_resource_quota("extra", ns)
    with pytest.raises(ApiException) as exc:
        prod.create_namespaced_resource_quota(ns, {"metadata": {"name": "bad"}, "spec": {"hard": {"pods": "lots"}}})
    assert exc.value.status == 422
