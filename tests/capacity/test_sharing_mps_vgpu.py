"""MPS: the policy's replicas reach the device plugin's config as sharing.mps, GFD labels the node mps,
discovery records it, each client's limits (memory / replicas, 100 / replicas % SMs) are shown.
vGPU: the simulator's vm-vgpu nodes advertise their vGPU type, discovery inventories it."""

import pytest
import yaml
from reconfig_sim import start_sim

from capacity.models import GpuCapacity, NodeCapacity, SpecAndCount, TimeSlicingPolicy
from capacity.services.discovery import discover_cluster
from capacity.services.mig_configs import apply_time_slicing
from capacity.services.planning import tier_plan
from simcluster.gpuoperator import refresh_devices
from simcluster.kube import ClusterApi

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-dev", "H100-80GB", 2, None, "dev")])
    with sim.state.lock:
        ClusterApi(sim.sim_cluster).create(
            "configmaps", "gpu-operator", {"metadata": {"name": "time-slicing-config"}, "data": {}}
        )
    yield sim
    sim.server.stop()


def test_mps_policy_reaches_the_device_plugin_config_and_the_node(sim):
    policy = TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=4, strategy="mps")
    assert apply_time_slicing(sim.cluster) == {"keys": ["gpuaas-dev-mps-x4"], "labelled": 1, "unlabelled": 0}
    data = sim.sim_cluster.configmaps[("gpu-operator", "time-slicing-config")].obj["data"]
    assert yaml.safe_load(data["gpuaas-dev-mps-x4"]) == {
        "version": "v1",
        "sharing": {"mps": {"renameByDefault": False, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    }
    node = sim.node("gpu-dev")
    assert node.labels["nvidia.com/device-plugin.config"] == "gpuaas-dev-mps-x4"
    assert node.labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert node.device_capacity["nvidia.com/gpu"] == 8
    assert policy.client_limits(81559) == {"pinned_memory_mib": 20389, "active_thread_percentage": 25}

    assert discover_cluster(sim.cluster.pk, inventory="none").run.status == "succeeded"
    row = NodeCapacity.objects.get(cluster=sim.cluster, name="gpu-dev")
    assert (row.sharing_strategy, row.timeslice_replicas) == ("mps", 4)
    # Its offer is MPS clients everywhere: the spec row, the tier plan, what approval draws from (issue #30).
    assert list(row.specs.values_list("kind", "replicas")) == [("mps", 4)]
    plan = tier_plan()
    assert {(s.kind, s.per_gpu) for t in plan.tiers for s in t.specs if s.product == "H100-80GB"} >= {("mps", 4)}
    assert not GpuCapacity.objects.filter(node=row).timeslice_hosts(mps=False).exists()
    assert GpuCapacity.objects.filter(node=row).timeslice_hosts(mps=True).count() == row.gpus.count()


def test_time_slicing_policy_has_no_client_limits(sim):
    policy = TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=4)
    assert policy.client_limits(81559) is None
    apply_time_slicing(sim.cluster)
    assert discover_cluster(sim.cluster.pk, inventory="none").run.status == "succeeded"
    assert NodeCapacity.objects.get(cluster=sim.cluster, name="gpu-dev").sharing_strategy == "time-slicing"


@pytest.fixture
def vgpu_sim(tmp_path):
    sim = start_sim(tmp_path, [("kv-h100", "H100-80GB", 2, None, "vm"), ("kv-a100", "A100-40GB", 1, None, "vm")])
    with sim.state.lock:
        for name, vgpu_type in (("kv-h100", "H100XM-20C"), ("kv-a100", "A100-5C")):
            node = sim.node(name)
            node.labels.update({"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": vgpu_type})
            refresh_devices(sim.sim_cluster, node)
    yield sim
    sim.server.stop()


def test_simulated_vgpu_nodes_are_inventoried_with_real_type_names_and_counts(vgpu_sim):
    assert vgpu_sim.node("kv-h100").device_capacity == {"nvidia.com/NVIDIA_H100XM-20C": 8}  # 2 GPUs x 4
    assert discover_cluster(vgpu_sim.cluster.pk, inventory="none").run.status == "succeeded"
    rows = SpecAndCount.objects.filter(node__cluster=vgpu_sim.cluster, kind="vgpu").order_by("node__name")
    assert [(r.node.name, r.resource_name, r.product, r.profile_name, r.count, r.replicas) for r in rows] == [
        ("kv-a100", "nvidia.com/NVIDIA_A100-5C", "A100-40GB", "A100-5C", 8, 8),
        ("kv-h100", "nvidia.com/NVIDIA_H100XM-20C", "H100-80GB", "H100XM-20C", 8, 4),
    ]
