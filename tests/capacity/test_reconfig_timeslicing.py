"""Time-slicing: the device plugin's ConfigMap key and node label per node group; replicas are tier-3 slots."""

import pytest
import yaml
from reconfig_sim import node_row, start_sim

from capacity.models import TimeSlicingPolicy
from capacity.services.mig_configs import apply_time_slicing
from capacity.services.planning import tier_plan
from simcluster.kube import ClusterApi

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(
        tmp_path,
        [("gpu-dev", "H100-80GB", 2, None, "dev"), ("gpu-prod", "H100-80GB", 2, None, "prod")],
    )
    with sim.state.lock:
        ClusterApi(sim.sim_cluster).create(
            "configmaps",
            "gpu-operator",
            {"metadata": {"name": "time-slicing-config"}, "data": {"any": "version: v1\n"}},
        )
    yield sim
    sim.server.stop()


def configmap(sim) -> dict:
    return sim.sim_cluster.configmaps[("gpu-operator", "time-slicing-config")].obj["data"]


def test_policy_writes_its_key_and_labels_the_groups_nodes(sim):
    policy = TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=4)

    result = apply_time_slicing(sim.cluster)

    assert result == {"keys": ["gpuaas-dev-x4"], "labelled": 1, "unlabelled": 0}
    data = configmap(sim)
    assert data["any"] == "version: v1\n"  # someone else's key is kept
    assert yaml.safe_load(data["gpuaas-dev-x4"]) == {
        "version": "v1",
        "sharing": {
            "timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
            }
        },
    }
    dev, prod = sim.node("gpu-dev"), sim.node("gpu-prod")
    assert dev.labels["nvidia.com/device-plugin.config"] == "gpuaas-dev-x4"
    assert "nvidia.com/device-plugin.config" not in prod.labels
    assert dev.device_capacity["nvidia.com/gpu"] == 8  # the device plugin advertises 2 GPUs x 4
    assert dev.labels["nvidia.com/gpu.replicas"] == "4"
    assert prod.device_capacity["nvidia.com/gpu"] == 2
    policy.refresh_from_db()
    assert (policy.nodes_labelled, policy.last_error) == (1, "")
    assert policy.applied_at is not None

    sim.discover()
    assert node_row("gpu-dev").timeslice_replicas == 4
    (untiered,) = tier_plan(cluster=sim.cluster).tiers  # the sim's nodes carry no tier
    assert [(s.kind, s.per_gpu, s.gpus, s.total) for s in untiered.specs] == [
        ("full", 1, 2, 2),
        ("timeslice", 4, 2, 8),
    ]


def test_changing_replicas_relabels_and_disabling_removes(sim):
    policy = TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=4)
    apply_time_slicing(sim.cluster)
    sim.discover()
    policy.replicas = 2
    policy.save()

    apply_time_slicing(sim.cluster)
    assert sorted(configmap(sim)) == ["any", "gpuaas-dev-x2"]
    assert sim.node("gpu-dev").labels["nvidia.com/device-plugin.config"] == "gpuaas-dev-x2"
    assert sim.node("gpu-dev").device_capacity["nvidia.com/gpu"] == 4
    sim.discover()

    policy.enabled = False
    policy.save()
    result = apply_time_slicing(sim.cluster)
    assert result == {"keys": [], "labelled": 0, "unlabelled": 1}
    assert sorted(configmap(sim)) == ["any"]
    assert "nvidia.com/device-plugin.config" not in sim.node("gpu-dev").labels


def test_a_cluster_wide_policy_yields_to_a_groups_own(sim):
    TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="", replicas=2)
    TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=8)
    apply_time_slicing(sim.cluster)
    assert sim.node("gpu-dev").labels["nvidia.com/device-plugin.config"] == "gpuaas-dev-x8"
    assert sim.node("gpu-prod").labels["nvidia.com/device-plugin.config"] == "gpuaas-all-x2"


def test_a_failing_api_is_recorded_on_the_policy(sim, settings):
    from capacity.adapters import kubernetes as kube

    settings.KUBERNETES_RETRIES = 0
    policy = TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=4)
    sim.state.faults.api_error(5, status=500, path_prefix="/api/v1/namespaces/gpu-operator/configmaps")
    with pytest.raises(kube.Unavailable):
        apply_time_slicing(sim.cluster)
    sim.state.faults.reset()
    policy.refresh_from_db()
    assert policy.last_error.startswith("Unavailable: ")
    assert policy.applied_at is None
