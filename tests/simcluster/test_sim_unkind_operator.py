"""The unkind GPU Operator knobs (docs/simcluster.md): a device plugin that keeps its devices until its pod
restarts, a MIG manager reading a mounted ConfigMap copy refreshed late, `rebooting`, and assert-first."""

from __future__ import annotations

import time

import yaml

from simcluster import Scenario, driver, gpuoperator
from simcluster.kube import ClusterApi
from simcluster.state import SimState

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
PLUGIN = "nvidia.com/gpu.deploy.device-plugin"


def build(**knobs) -> SimState:
    """One H100 node (2 GPUs, all-3g.40gb: two 3g.40gb each) with the given SimState knobs."""
    spec = {
        "name": "t",
        "seed": 1,
        "clusters": [
            {
                "name": "lab",
                "node_groups": [
                    {
                        "name_prefix": "n",
                        "count": 1,
                        "product": "H100-80GB",
                        "gpus_per_node": 2,
                        "mig_strategy": "mixed",
                        "mig_layout": "all-3g.40gb",
                    }
                ],
            }
        ],
    }
    return Scenario.from_dict(spec).build(SimState(seed=1, mig_manager_delay=3600, **knobs))


def only_node(state: SimState):
    cluster = state.cluster("lab")
    return cluster, next(iter(cluster.nodes.values()))


def plugin_pods(cluster, node) -> list[str]:
    return sorted(
        name
        for (ns, name), record in cluster.pods.items()
        if record.obj["metadata"]["labels"].get("app") == gpuoperator.DEVICE_PLUGIN_APP
        and record.obj["spec"]["nodeName"] == node.name
    )


def split_gpu0_by_nvml(state: SimState, node) -> None:
    """Destroy GPU 0's second 3g.40gb and create a 1g.10gb in its place, as the node agent would."""
    gpu = node.gpu(0)
    second = max(gpu.instances.values(), key=lambda gi: gi.start)
    args = {"gpu": 0, "gi": second.id}
    assert driver.nvml_op(state, "lab", node.name, "destroy_ci", {**args, "ci": 0})["ret"] == 0
    assert driver.nvml_op(state, "lab", node.name, "destroy_gi", args)["ret"] == 0
    created = driver.nvml_op(state, "lab", node.name, "create_gi", {"gpu": 0, "profile_id": 19, "start": 4})
    assert created["ret"] == 0, created
    ci = driver.nvml_op(state, "lab", node.name, "create_ci", {"gpu": 0, "gi": created["gi"], "slices": 1})
    assert ci["ret"] == 0


def test_device_plugin_keeps_its_devices_until_its_pod_restarts():
    state = build(device_plugin_restart=True)
    cluster, node = only_node(state)
    [pod] = plugin_pods(cluster, node)
    assert node.device_capacity == {"nvidia.com/mig-3g.40gb": 4}

    split_gpu0_by_nvml(state, node)

    assert node.device_capacity == {"nvidia.com/mig-3g.40gb": 4}  # the old list, as the real plugin keeps it
    assert node.labels["nvidia.com/mig-1g.10gb.count"] == "1"  # GFD relabels from NVML
    ClusterApi(cluster).delete("pods", "gpu-operator", pod)
    [new_pod] = plugin_pods(cluster, node)
    assert new_pod != pod  # the DaemonSet recreated it
    assert node.device_capacity == {"nvidia.com/mig-3g.40gb": 3, "nvidia.com/mig-1g.10gb": 1}


def test_kind_device_plugin_follows_nvml_at_once():
    state = build()
    cluster, node = only_node(state)
    assert plugin_pods(cluster, node) == []
    split_gpu0_by_nvml(state, node)
    assert node.device_capacity == {"nvidia.com/mig-3g.40gb": 3, "nvidia.com/mig-1g.10gb": 1}


def write_gpuaas_config(cluster, configs: dict) -> None:
    ClusterApi(cluster).create(
        "configmaps",
        "gpu-operator",
        {
            "metadata": {"name": gpuoperator.GPUAAS_MIG_CONFIGMAP},
            "data": {"config.yaml": yaml.safe_dump({"version": "v1", "mig-configs": configs})},
        },
    )


def set_label(cluster, node, config: str) -> None:
    ClusterApi(cluster).patch(
        "nodes", None, node.name, {"metadata": {"labels": {MIG_CONFIG: config}}}, "application/merge-patch+json"
    )


SEVENS = {"gpuaas-sevens": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}


def test_mig_manager_reads_its_mounted_copy_which_kubelet_refreshes_late():
    state = build(configmap_sync_delay=0.3)
    cluster, node = only_node(state)
    write_gpuaas_config(cluster, SEVENS)

    set_label(cluster, node, "gpuaas-sevens")  # at once: the mounted copy has no gpuaas ConfigMap yet

    assert node.labels[MIG_STATE] == "failed"
    assert "not found in ConfigMap default-mig-parted-config" in node.mig_message
    time.sleep(0.35)
    set_label(cluster, node, "all-disabled")
    set_label(cluster, node, "gpuaas-sevens")  # the manager reacts to a changed label only
    assert node.labels[MIG_STATE] == "pending"
    state.run_mig_manager()
    assert node.labels[MIG_STATE] == "success"
    assert node.gpu(1).layout() == ["1g.10gb"] * 7


def test_mig_manager_skips_work_when_the_config_is_already_applied():
    state = build()
    cluster, node = only_node(state)
    set_label(cluster, node, "all-disabled")
    state.run_mig_manager()
    uuids = [gpu.uuid for gpu in node.gpus]

    gpuoperator.add_mig_configs(cluster, {"same-as-now": [{"devices": "all", "mig-enabled": False}]})
    set_label(cluster, node, "same-as-now")

    assert node.labels[MIG_STATE] == "success"  # mig-parted assert passed: no pending, nothing drained
    assert node.labels[PLUGIN] == "true"
    assert node.mig_job is None
    assert "already applied" in node.mig_message
    assert [gpu.uuid for gpu in node.gpus] == uuids


def test_mig_mode_change_passes_through_rebooting():
    state = build(mig_mode_reboot=True, device_plugin_restart=True)
    cluster, node = only_node(state)
    [pod] = plugin_pods(cluster, node)

    set_label(cluster, node, "all-disabled")
    assert node.labels[MIG_STATE] == "pending"
    assert node.labels[PLUGIN] == "paused-for-mig-change"
    state.run_mig_manager()
    assert node.labels[MIG_STATE] == "rebooting"
    assert node.gpu(0).mig_current == 1  # not applied before the reboot
    state.run_mig_manager()

    assert node.labels[MIG_STATE] == "success"
    assert node.labels[PLUGIN] == "true"
    assert [gpu.mig_current for gpu in node.gpus] == [0, 0]
    assert plugin_pods(cluster, node) != [pod]  # the manager's drain restarted the plugin
    assert node.device_capacity.get("nvidia.com/gpu") == 2


def test_profile_only_change_needs_no_reboot():
    state = build(mig_mode_reboot=True)
    cluster, node = only_node(state)
    set_label(cluster, node, "all-1g.10gb")
    state.run_mig_manager()
    assert node.labels[MIG_STATE] == "success"
