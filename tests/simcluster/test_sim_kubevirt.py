"""The simulator's KubeVirt VirtualMachineInstance API and vGPU device manager, over HTTP as a client sees them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import yaml

from capacity.vgpu import device_manager_document
from simcluster import SimServer, load_scenario
from simcluster.gpuoperator import refresh_devices
from simcluster.kube import ClusterApi

NODE = "prod-h100-full-02"
VMIS = "/apis/kubevirt.io/v1/namespaces/vms/virtualmachineinstances"
KUBEVIRT = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt"
MDEV_20C = {"mdevNameSelector": "NVIDIA H100XM-20C", "resourceName": "nvidia.com/NVIDIA_H100XM-20C"}


def permit(cluster, *entries):
    """The cluster admin's edit of the KubeVirt CR: these mediated devices permitted (provided by NVIDIA's plugin)."""
    devices = [{**e, "externalResourceProvider": True} for e in entries]
    patch = {"spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": devices}}}}
    ClusterApi(cluster).patch("kubevirts", "kubevirt", "kubevirt", patch, "application/merge-patch+json")


@pytest.fixture
def server():
    state = load_scenario("demo").build()
    state.mig_manager_delay = 3600  # jobs run when a test says so
    cluster = state.cluster("prod")
    with state.lock:
        node = cluster.nodes[NODE]
        node.labels.update({"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "H100XM-20C"})
        refresh_devices(cluster, node)
        ClusterApi(cluster).create("namespaces", None, {"metadata": {"name": "vms"}})
        permit(cluster, MDEV_20C)
    with SimServer(state) as srv:
        yield srv


def call(server, method, path, body=None, content_type="application/json"):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.cluster_url('prod')}{path}", data=data, method=method)
    request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def vmi(name, device="nvidia.com/NVIDIA_H100XM-20C"):
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name},
        "spec": {"domain": {"devices": {"gpus": [{"name": "vgpu1", "deviceName": device}]}}},
    }


def test_the_group_is_discoverable(server):
    code, groups = call(server, "GET", "/apis")
    assert code == 200 and "kubevirt.io" in [g["name"] for g in groups["groups"]]
    code, resources = call(server, "GET", "/apis/kubevirt.io/v1")
    assert [(r["name"], r["kind"], r["namespaced"]) for r in resources["resources"]] == [
        ("virtualmachineinstances", "VirtualMachineInstance", True),
        ("kubevirts", "KubeVirt", True),
    ]


def test_the_kubevirt_cr_is_served_and_lists_what_it_permits(server):
    code, cr = call(server, "GET", KUBEVIRT)
    assert (code, cr["kind"], cr["apiVersion"]) == (200, "KubeVirt", "kubevirt.io/v1")
    (device,) = cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    assert device == {**MDEV_20C, "externalResourceProvider": True}
    code, listed = call(server, "GET", "/apis/kubevirt.io/v1/kubevirts")
    assert (code, [i["metadata"]["name"] for i in listed["items"]]) == (200, ["kubevirt"])


def test_a_vmi_whose_mdev_is_not_permitted_stays_scheduling_until_the_cr_permits_it(server):
    with server.state.lock:
        permit(server.state.cluster("prod"))  # nothing permitted
    code, created = call(server, "POST", VMIS, vmi("vm-p"))
    assert code == 201
    server.state.run_kubelet()
    code, answer = call(server, "GET", f"{VMIS}/vm-p")
    assert answer["status"]["phase"] == "Scheduling"
    (condition,) = answer["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert condition["message"].startswith("nvidia.com/NVIDIA_H100XM-20C not permitted in the KubeVirt CR's")
    assert call(server, "GET", "/api/v1/namespaces/vms/pods")[1]["items"] == []  # no launcher pod

    with server.state.lock:
        permit(server.state.cluster("prod"), MDEV_20C)
    server.state.run_kubelet()  # virt-controller's resync, then the kubelet starts the pod
    code, answer = call(server, "GET", f"{VMIS}/vm-p")
    assert (answer["status"]["phase"], answer["status"]["nodeName"]) == ("Running", NODE)


def test_a_vmi_runs_in_a_launcher_pod_holding_its_vgpu_and_deleting_it_frees_the_vgpu(server):
    code, created = call(server, "POST", VMIS, vmi("vm-1"))
    assert code == 201
    server.state.run_kubelet()
    code, listed = call(server, "GET", VMIS)
    (item,) = listed["items"]
    assert (item["metadata"]["name"], item["status"]["phase"], item["status"]["nodeName"]) == ("vm-1", "Running", NODE)
    code, pods = call(server, "GET", "/api/v1/namespaces/vms/pods?labelSelector=kubevirt.io%3Dvirt-launcher")
    (pod,) = pods["items"]
    assert pod["metadata"]["annotations"]["kubevirt.io/domain"] == "vm-1"
    assert pod["metadata"]["labels"]["kubevirt.io/created-by"] == created["metadata"]["uid"]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/NVIDIA_H100XM-20C": "1"}
    node = server.state.cluster("prod").nodes[NODE]
    assert len(node.devices["nvidia.com/NVIDIA_H100XM-20C"]) == 32
    assert sum("::vgpu-" in d for d in node.assigned) == 1

    code, _ = call(server, "DELETE", f"{VMIS}/vm-1")
    assert code == 200
    server.state.run_kubelet()
    assert call(server, "GET", "/api/v1/namespaces/vms/pods")[1]["items"] == []
    assert not any("::vgpu-" in d for d in node.assigned)
    assert call(server, "GET", f"{VMIS}/vm-1")[0] == 404


def test_a_gpu_kubevirt_does_not_permit_is_invalid(server):
    code, answer = call(server, "POST", VMIS, vmi("vm-x", device="example.com/fpga"))
    assert (code, answer["reason"]) == (422, "Invalid")
    assert "is not permitted in permittedHostDevices" in answer["message"]


def test_a_refused_launcher_pod_leaves_the_vmi_pending_with_the_reason(server):
    quota = {"metadata": {"name": "q"}, "spec": {"hard": {"requests.nvidia.com/NVIDIA_H100XM-20C": "0"}}}
    assert call(server, "POST", "/api/v1/namespaces/vms/resourcequotas", quota)[0] == 201
    code, created = call(server, "POST", VMIS, vmi("vm-q"))
    assert code == 201
    assert created["status"]["phase"] == "Pending"
    (condition,) = created["status"]["conditions"]
    assert (condition["type"], condition["reason"]) == ("Synchronized", "FailedCreate")
    assert "exceeded quota" in condition["message"]


def _write_config(server):
    text = yaml.safe_dump(device_manager_document())
    body = {"metadata": {"name": "gpuaas-vgpu-devices-config"}, "data": {"config.yaml": text}}
    assert call(server, "POST", "/api/v1/namespaces/gpu-operator/configmaps", body)[0] == 201


def _label(server, value):
    patch = {"metadata": {"labels": {"nvidia.com/vgpu.config": value}}}
    code, node = call(server, "PATCH", f"/api/v1/nodes/{NODE}", patch, "application/merge-patch+json")
    assert code == 200
    return node["metadata"]["labels"].get("nvidia.com/vgpu.config.state")


def test_the_device_manager_takes_time_then_recreates_the_vgpus(server):
    _write_config(server)
    assert _label(server, "H100XM-40C") == "pending"
    node = server.state.cluster("prod").nodes[NODE]
    assert set(node.devices) == {"nvidia.com/NVIDIA_H100XM-20C"}  # still the old vGPUs
    server.state.run_mig_manager()
    assert node.labels["nvidia.com/vgpu.config.state"] == "success"
    assert {r: len(d) for r, d in node.devices.items()} == {"nvidia.com/NVIDIA_H100XM-40C": 16}


def test_the_device_manager_fails_without_its_config_or_for_another_gpus_type(server):
    assert _label(server, "H100XM-40C") == "failed"  # no ConfigMap
    _write_config(server)
    assert _label(server, "A100-40C") == "failed"  # an A100 type on H100 GPUs
    node = server.state.cluster("prod").nodes[NODE]
    assert "not one type of this GPU" in node.vgpu_message
    assert set(node.devices) == {"nvidia.com/NVIDIA_H100XM-20C"}


def test_the_device_manager_cannot_recreate_vgpus_a_vm_holds(server):
    _write_config(server)
    call(server, "POST", VMIS, vmi("vm-busy"))
    server.state.run_kubelet()
    assert _label(server, "H100XM-40C") == "pending"
    server.state.run_mig_manager()
    node = server.state.cluster("prod").nodes[NODE]
    assert node.labels["nvidia.com/vgpu.config.state"] == "failed"
    assert set(node.devices) == {"nvidia.com/NVIDIA_H100XM-20C"}
