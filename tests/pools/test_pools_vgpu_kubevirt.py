"""vGPU through KubeVirt, end to end in the simulator: an operator sets a vm-vgpu node's vGPU type (device
manager ConfigMap + nvidia.com/vgpu.config), a member's VM request is approved and provisioned as quota on the
type's extended resource, the team's VirtualMachineInstance runs on that type (its virt-launcher pod holds the
vGPU), discovery attributes it to the project as a VM, and the pool is metered and billed with the licence.
A type change is refused while the VM runs, a VMI asking for a type the node does not offer stays unscheduled,
and only operators may set a node's vGPU type. Runs on SQLite and on PostgreSQL (DATABASE_URL)."""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from decimal import Decimal

import pytest
import yaml
from django.utils import timezone
from pool_world import kube_for

from billing import services as billing
from billing.models import StatementLine
from capacity.adapters.kubernetes import api_url_for
from capacity.adapters.nvml import node_vgpus
from capacity.models import NodeCapacity, SpecAndCount, WorkloadProfile
from capacity.services.discovery import discover_cluster
from capacity.vgpu import VGPU_TYPES
from pools import services
from pools.models import Allocation, PoolRequest
from pools.tasks import provision_pool_task
from pricing.services import seed_default_card
from simcluster.gpuoperator import refresh_devices
from simcluster.kube import ClusterApi

NODE = "prod-h100-full-02"
URL = "/api/v1/pool-requests/"


def _permit(sim, *vgpu_types):
    """The KubeVirt CR permits these types' mediated devices (as gpuaas writes them when it sets a type)."""
    with kube_for(sim.clusters["prod"]) as kube:
        return kube.permit_mediated_devices([VGPU_TYPES[t].permitted_device for t in vgpu_types])


def _permitted(sim):
    with kube_for(sim.clusters["prod"]) as kube:
        cr = kube.kubevirt_cr()
    return cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]


def _vm_vgpu_node(sim, vgpu_type="H100XM-40C"):
    """One of the demo's full-GPU nodes switched to the GPU Operator's vm-vgpu mode, tier 2, rediscovered, its
    type permitted in the KubeVirt CR. The device manager's jobs run only when a test says so (run_mig_manager),
    never on the clock."""
    with sim.state.lock:
        sim.state.mig_manager_delay = 3600
        node = sim.state.cluster("prod").nodes[NODE]
        node.labels.update(
            {"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": vgpu_type, "gpuaas.io/tier": "2"}
        )
        refresh_devices(sim.state.cluster("prod"), node)
    _permit(sim, vgpu_type)
    _discover(sim)
    return NodeCapacity.objects.get(name=NODE)


def _discover(sim):
    assert discover_cluster(sim.clusters["prod"].pk, inventory="inline").run.status == "succeeded"


def _vmi(name, device="nvidia.com/NVIDIA_H100XM-20C", **spec):
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"domain": {"devices": {"gpus": [{"name": "vgpu1", "deviceName": device}]}}, **spec},
    }


def _create_vmi(sim, namespace, body):
    with sim.state.lock:
        api = ClusterApi(sim.state.cluster("prod"))
        if namespace not in sim.state.cluster("prod").namespaces:
            api.create("namespaces", None, {"metadata": {"name": namespace}})
        code, raw = api.create("virtualmachineinstances", namespace, body)
    assert code == 201
    return json.loads(raw)


def _get_vmi(sim, namespace, name):
    """Through the HTTP API, as kubectl would read it."""
    url = f"{sim.cluster_url('prod')}/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}"
    with urllib.request.urlopen(url) as answer:
        return json.load(answer)


def _set_type(api, operator, node, vgpu_type):
    return api(operator).post(f"/api/v1/capacity/nodes/{node.pk}/vgpu-config/", {"vgpu_type": vgpu_type}, format="json")


def test_a_vgpu_pool_goes_from_request_to_a_running_vm_to_a_statement_line(sim, api, bob, operator, project, settings):
    settings.BILLING_VGPU_LICENCE_HOURLY = Decimal("0.05")
    seed_default_card()
    node = _vm_vgpu_node(sim)
    assert SpecAndCount.objects.get(node=node, kind="vgpu").profile_name == "H100XM-40C"

    # The operator carves the node into H100XM-20C: gpuaas writes the device manager's ConfigMap and the label.
    response = _set_type(api, operator, node, "H100XM-20C")
    assert response.status_code == 200, response.data
    assert response.data == {"node": NODE, "vgpu_type": "H100XM-20C", "changed": True}
    with kube_for(sim.clusters["prod"]) as kube:
        document = yaml.safe_load(
            kube.get_config_map("gpu-operator", "gpuaas-vgpu-devices-config")["data"]["config.yaml"]
        )
        labels = kube.get_node(NODE).labels
    assert document["vgpu-configs"]["H100XM-20C"] == [{"devices": "all", "vgpu-devices": {"H100XM-20C": 4}}]
    assert (labels["nvidia.com/vgpu.config"], labels["nvidia.com/vgpu.config.state"]) == ("H100XM-20C", "pending")
    # ... and KubeVirt is told VMs may use the type's mediated device (the 40C entry stays).
    assert [d["resourceName"] for d in _permitted(sim)] == [
        "nvidia.com/NVIDIA_H100XM-40C",
        "nvidia.com/NVIDIA_H100XM-20C",
    ]
    assert _permitted(sim)[1] == {
        "mdevNameSelector": "NVIDIA H100XM-20C",
        "resourceName": "nvidia.com/NVIDIA_H100XM-20C",
        "externalResourceProvider": True,
    }
    assert _permit(sim, "H100XM-20C") is False  # idempotent: nothing written
    _discover(sim)
    node.refresh_from_db()
    assert (node.vgpu_config, node.vgpu_config_state) == ("H100XM-20C", "pending")
    # Not recreated yet: the 40C vGPUs are still advertised but going away, so the node offers no vGPU meanwhile.
    assert not SpecAndCount.objects.filter(node=node, kind="vgpu").exists()

    sim.state.run_mig_manager()  # reconfiguration takes time; the device manager's job runs now
    _discover(sim)
    node.refresh_from_db()
    assert node.vgpu_config_state == "success"
    offered = SpecAndCount.objects.get(node=node, kind="vgpu")
    assert (offered.profile_name, offered.resource_name, offered.count) == (
        "H100XM-20C",
        "nvidia.com/NVIDIA_H100XM-20C",
        32,
    )

    # request -> approval -> provisioning: quota on the type's extended resource in the project's namespace.
    body = {"project": project.pk, "workload_type": "staging", "vgpu_type": "H100XM-20C", "count": 2}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    request = PoolRequest.objects.get(pk=response.data["id"])
    request.state = "submitted"
    request.save(update_fields=["state"])
    pool = services.approve(request, actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    with kube_for(sim.clusters["prod"]) as kube:
        hard = kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]
    assert hard["requests.nvidia.com/NVIDIA_H100XM-20C"] == "2"

    # The team's VM: its virt-launcher pod takes a vGPU of the type; the VMI runs on the node.
    _create_vmi(sim, "team-a", _vmi("notebook-vm"))
    sim.state.run_kubelet()
    vmi = _get_vmi(sim, "team-a", "notebook-vm")
    assert (vmi["status"]["phase"], vmi["status"]["nodeName"]) == ("Running", NODE)
    assert vmi["metadata"]["labels"]["kubevirt.io/nodeName"] == NODE

    # Discovery attributes the VM (its launcher pod) to the project, on the node's GPU.
    _discover(sim)
    (row,) = WorkloadProfile.objects.running().filter(resource_name="nvidia.com/NVIDIA_H100XM-20C")
    assert (row.namespace, row.vmi_name, row.project_id, row.node_id) == ("team-a", "notebook-vm", project.pk, node.pk)
    assert row.pod_name.startswith("virt-launcher-notebook-vm-")
    assert str(row) == "team-a/notebook-vm (VM, nvidia.com/NVIDIA_H100XM-20C)"

    # The host side: NVML's vGPU calls name the VM's vGPU (its mdev id, the device the plugin gave the pod) and
    # its utilisation.
    (reading,) = node_vgpus(api_url_for(sim.clusters["prod"]), NODE)
    assert (reading.vgpu_type, reading.gpu_uuid) == ("H100XM-20C", row.gpu.uuid)
    assert reading.mdev_uuid in row.device_ids
    assert 0 < reading.sm_util_pct <= 100 and reading.fb_used_mib > 0

    # Metered and billed per type, licence included.
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=3)
    Allocation.objects.filter(pool=pool).update(allocated_at=start)
    billing.meter_usage(now=start + dt.timedelta(hours=3))
    statement = billing.generate_statement(project, start.date().replace(day=1))
    (line,) = StatementLine.objects.filter(statement=statement, kind="vgpu")
    assert (line.profile_name, line.replicas, line.hourly_rate) == ("H100XM-20C", 4, Decimal("0.675000"))
    assert "licence 0.05/h" in line.description
    assert line.amount == Decimal("0.675000") * 2 * 3


def test_a_type_change_is_refused_while_a_vm_runs_on_the_nodes_vgpus(sim, api, operator):
    node = _vm_vgpu_node(sim, "H100XM-20C")
    _create_vmi(sim, "vms", _vmi("db-vm"))
    sim.state.run_kubelet()
    _discover(sim)
    with kube_for(sim.clusters["prod"]) as kube:
        before = kube.get_node(NODE).labels

    response = _set_type(api, operator, node, "H100XM-40C")
    assert response.status_code == 400
    assert response.data == {
        "vgpu_type": [
            f"{NODE}'s vGPUs (H100XM-20C) are in use by VM vms/db-vm (H100XM-20C): stop those VMs and "
            "release those pools before changing the type"
        ]
    }
    with kube_for(sim.clusters["prod"]) as kube:
        assert kube.get_node(NODE).labels == before  # nothing written
        with pytest.raises(Exception, match="NotFound|not found"):
            kube.get_config_map("gpu-operator", "gpuaas-vgpu-devices-config")


def test_the_device_manager_itself_refuses_to_recreate_vgpus_a_vm_holds(sim, api, operator):
    """A label set behind gpuaas's back (or a VM started between gpuaas's check and the apply): the device
    manager cannot destroy a vGPU in use, so the state goes failed and the old type stays."""
    node = _vm_vgpu_node(sim, "H100XM-20C")
    assert _set_type(api, operator, node, "H100XM-40C").status_code == 200  # writes the ConfigMap
    assert _set_type(api, operator, node, "H100XM-20C").status_code == 200  # back again while pending
    sim.state.run_mig_manager()
    _create_vmi(sim, "vms", _vmi("late-vm"))
    sim.state.run_kubelet()
    with kube_for(sim.clusters["prod"]) as kube:
        kube.patch_node_labels(NODE, {"nvidia.com/vgpu.config": "H100XM-40C"})
    sim.state.run_mig_manager()
    _discover(sim)
    node.refresh_from_db()
    assert node.vgpu_config_state == "failed"
    assert SpecAndCount.objects.get(node=node, kind="vgpu").profile_name == "H100XM-20C"
    assert "in use by vms/virt-launcher-late-vm-" in sim.state.cluster("prod").nodes[NODE].vgpu_message


def test_a_vmi_asking_for_a_type_the_node_does_not_offer_stays_unscheduled(sim, api, operator):
    _vm_vgpu_node(sim, "H100XM-20C")
    _permit(sim, "H100XM-10C")  # permitted, but no node offers it
    _create_vmi(sim, "vms", _vmi("wrong-vm", device="nvidia.com/NVIDIA_H100XM-10C"))
    sim.state.run_kubelet()
    vmi = _get_vmi(sim, "vms", "wrong-vm")
    assert vmi["status"]["phase"] == "Scheduling"
    (condition,) = vmi["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert "nvidia.com/NVIDIA_H100XM-10C" in condition["message"]
    assert "nodeName" not in vmi["status"]
    _discover(sim)
    assert not WorkloadProfile.objects.filter(vmi_name="wrong-vm", node__isnull=False).exists()


@pytest.mark.parametrize(
    ("vgpu_type", "message"),
    [
        ("A100-40C", "prod-h100-full-02's GPUs (H100-80GB) offer H100-4C"),
        ("H100XM-30C", "not 'H100XM-30C'"),
    ],
)
def test_a_type_the_nodes_gpu_does_not_offer_is_a_400(sim, api, operator, vgpu_type, message):
    node = _vm_vgpu_node(sim, "H100XM-20C")
    response = _set_type(api, operator, node, vgpu_type)
    assert response.status_code == 400
    assert message in response.data["vgpu_type"][0]


def test_a_node_not_in_vm_vgpu_mode_is_refused(sim, api, operator):
    node = NodeCapacity.objects.get(name="prod-h100-full-01")
    response = _set_type(api, operator, node, "H100XM-20C")
    assert response.status_code == 400
    assert "not in vm-vgpu mode" in response.data["node"][0]


def test_only_operators_set_a_nodes_vgpu_type(sim, api, bob, project, django_user_model):
    node = _vm_vgpu_node(sim, "H100XM-20C")
    outsider = django_user_model.objects.create_user("charlie", "charlie@example.com", "pw-charlie-1")
    for user in (bob, outsider):
        assert _set_type(api, user, node, "H100XM-40C").status_code == 403
    with kube_for(sim.clusters["prod"]) as kube:
        assert kube.get_node(NODE).labels["nvidia.com/vgpu.config"] == "H100XM-20C"


def test_the_same_type_again_writes_nothing(sim, api, operator):
    node = _vm_vgpu_node(sim, "H100XM-20C")
    response = _set_type(api, operator, node, "H100XM-20C")
    assert response.data["changed"] is False


def test_a_cluster_that_refuses_the_label_is_a_503_and_nothing_is_recorded(sim, api, operator):
    node = _vm_vgpu_node(sim, "H100XM-20C")
    sim.state.faults.api_error(1, status=500, path_prefix=f"/api/v1/nodes/{NODE}", method="PATCH")
    response = _set_type(api, operator, node, "H100XM-40C")
    assert response.status_code == 503
    assert response.json()["detail"].startswith("cluster prod refused the change: ")
    node.refresh_from_db()
    assert node.vgpu_config == "H100XM-20C"


def test_a_vmi_whose_type_kubevirt_does_not_permit_stays_scheduling_with_the_reason(sim):
    """A node configured behind gpuaas's back: its vGPUs are advertised, but the KubeVirt CR does not list the type,
    so KubeVirt starts no VM on it; once gpuaas permits it (as setting the type does) the VM runs."""
    with sim.state.lock:
        node = sim.state.cluster("prod").nodes[NODE]
        node.labels.update({"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "H100XM-20C"})
        refresh_devices(sim.state.cluster("prod"), node)
    _create_vmi(sim, "vms", _vmi("early-vm"))
    sim.state.run_kubelet()
    vmi = _get_vmi(sim, "vms", "early-vm")
    (condition,) = vmi["status"]["conditions"]
    assert (vmi["status"]["phase"], condition["reason"]) == ("Scheduling", "Unschedulable")
    assert "nvidia.com/NVIDIA_H100XM-20C not permitted" in condition["message"]

    assert _permit(sim, "H100XM-20C") is True
    sim.state.run_kubelet()
    vmi = _get_vmi(sim, "vms", "early-vm")
    assert (vmi["status"]["phase"], vmi["status"]["nodeName"]) == ("Running", NODE)


def test_a_cluster_without_kubevirt_refuses_the_type_and_nothing_is_recorded(sim, api, operator):
    node = _vm_vgpu_node(sim, "H100XM-20C")
    with sim.state.lock:
        sim.state.cluster("prod").kubevirts.clear()
    response = _set_type(api, operator, node, "H100XM-40C")
    assert response.status_code == 503
    assert "no KubeVirt CR" in response.json()["detail"]
    node.refresh_from_db()
    assert node.vgpu_config == "H100XM-20C"
