"""MPS sharing: the policy's replicas reach the device plugin's config as sharing.mps, GFD labels the node
mps, discovery records it, and each client's limits (memory / replicas, 100 / replicas % SMs) are shown."""

import pytest
import yaml
from reconfig_sim import start_sim

from capacity.models import NodeCapacity, TimeSlicingPolicy
from capacity.services.discovery import discover_cluster
from capacity.services.mig_configs import apply_time_slicing
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


def test_time_slicing_policy_has_no_client_limits(sim):
    policy = TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=4)
    assert policy.client_limits(81559) is None
    apply_time_slicing(sim.cluster)
    assert discover_cluster(sim.cluster.pk, inventory="none").run.status == "succeeded"
    assert NodeCapacity.objects.get(cluster=sim.cluster, name="gpu-dev").sharing_strategy == "time-slicing"
