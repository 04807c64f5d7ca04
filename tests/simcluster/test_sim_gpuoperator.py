"""GPU Operator behaviour: GFD labels, device-plugin resources, MIG manager, time-slicing."""

from __future__ import annotations

import time

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from simcluster import Scenario, gpuoperator

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"


def nvidia_labels(node) -> dict[str, str]:
    return {k: v for k, v in node.metadata.labels.items() if k.startswith("nvidia.com/") and "deploy" not in k}


def wait_for_state(api, node_name: str, timeout: float = 5.0) -> str:
    """Poll the node label until the MIG manager leaves `pending` (its delay is 0.2 s)."""
    deadline = time.monotonic() + timeout
    while True:
        value = api.read_node(node_name).metadata.labels.get(MIG_STATE)
        if value != "pending" or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def small_state(**group):
    spec = {
        "name": "t",
        "seed": 1,
        "clusters": [
            {
                "name": "lab",
                "node_groups": [{"name_prefix": "n", "count": 1, "product": "H100-80GB", "gpus_per_node": 2, **group}],
            }
        ],
    }
    return Scenario.from_dict(spec).build()


# --- GFD labels ----------------------------------------------------------------------------


def test_mixed_strategy_labels_match_the_reference(prod):
    labels = nvidia_labels(prod.read_node("prod-h100-bal-01"))
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-1g.10gb.")} == {
        "nvidia.com/mig-1g.10gb.count": "16",
        "nvidia.com/mig-1g.10gb.engines.copy": "1",
        "nvidia.com/mig-1g.10gb.engines.decoder": "1",
        "nvidia.com/mig-1g.10gb.engines.encoder": "0",
        "nvidia.com/mig-1g.10gb.engines.jpeg": "1",
        "nvidia.com/mig-1g.10gb.engines.ofa": "0",
        "nvidia.com/mig-1g.10gb.memory": "9984",
        "nvidia.com/mig-1g.10gb.multiprocessors": "16",
        "nvidia.com/mig-1g.10gb.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        "nvidia.com/mig-1g.10gb.replicas": "1",
        "nvidia.com/mig-1g.10gb.sharing-strategy": "none",
        "nvidia.com/mig-1g.10gb.slices.ci": "1",
        "nvidia.com/mig-1g.10gb.slices.gi": "1",
    }
    assert labels["nvidia.com/mig-2g.20gb.memory"] == "20096"
    assert labels["nvidia.com/mig-2g.20gb.engines.copy"] == "2"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.replicas"] == "0"  # every GPU is MIG-enabled: no sharing info
    assert labels[MIG_CONFIG] == "all-balanced"
    assert labels[MIG_STATE] == "success"


def test_full_gpu_labels_match_the_reference_example(prod):
    labels = nvidia_labels(prod.read_node("prod-h100-full-01"))
    expected = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/gpu.present": "true",
        MIG_CONFIG: "all-disabled",
    }
    assert {k: labels[k] for k in expected} == expected
    assert not any(k.startswith("nvidia.com/mig-") for k in labels)
    allocatable = prod.read_node("prod-h100-full-01").status.allocatable
    assert allocatable["nvidia.com/gpu"] == "8"


def test_time_slicing_resources_and_labels(dev):
    node = dev.read_node("dev-h200-ts-01")
    labels = nvidia_labels(node)
    assert node.status.allocatable["nvidia.com/gpu"] == "32"
    assert node.status.capacity["nvidia.com/gpu"] == "32"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200-SHARED"
    assert labels["nvidia.com/device-plugin.config"] == "time-sliced-4"
    assert "nvidia.com/mig.strategy" not in labels


def test_single_strategy_valid_and_invalid():
    state = small_state(mig_strategy="single", mig_layout="all-1g.10gb")
    node = state.cluster().nodes["n-01"]
    labels = node.labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "9984"
    assert labels["nvidia.com/gpu.multiprocessors"] == "16"
    assert gpuoperator.node_resources(node)[1]["nvidia.com/gpu"] == "14"

    mixed = small_state(mig_strategy="single", mig_layout="all-balanced").cluster().nodes["n-01"]
    assert mixed.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"
    assert (mixed.labels["nvidia.com/gpu.count"], mixed.labels["nvidia.com/gpu.memory"]) == ("0", "0")
    assert "nvidia.com/gpu" not in gpuoperator.node_resources(mixed)[1]


def test_default_mig_parted_config_follows_the_operator(prod):
    cm = prod.read_namespaced_config_map("default-mig-parted-config", "gpu-operator")
    configs = yaml.safe_load(cm.data["config.yaml"])["mig-configs"]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    h100 = next(e for e in configs["all-balanced"] if "0x233010DE" in e["device-filter"])
    assert h100["mig-devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert {"0x233010DE", "0x20B210DE"} <= set(h100["device-filter"])  # H100-80GB and A100-80GB share it
    assert configs["prod-4g-3g"] == [
        {"devices": list(range(6)), "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "4g.40gb": 1}},
        {"devices": [6, 7], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("mig-configs: {a: [{devices: all, mig-enabled: false}]}", "missing version"),
        ("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "unknown version"),
        ("version: v1\nextra: 1\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "unexpected field: extra"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}", "missing mig-enabled"),
    ],
)
def test_mig_parted_validation(text, error):
    with pytest.raises(ValueError, match=error):
        gpuoperator.parse_mig_parted(text)


# --- MIG manager ---------------------------------------------------------------------------


def test_mig_manager_applies_a_new_config(prod, state):
    patched = prod.patch_node("prod-h100-bal-02", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    assert patched.metadata.labels[MIG_STATE] == "pending"
    assert patched.metadata.labels["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"
    assert wait_for_state(prod, "prod-h100-bal-02") == "success"
    node = prod.read_node("prod-h100-bal-02")
    assert node.metadata.labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert node.metadata.labels["nvidia.com/mig-1g.10gb.count"] == "56"
    assert "nvidia.com/mig-3g.40gb.count" not in node.metadata.labels
    assert node.status.allocatable["nvidia.com/mig-1g.10gb"] == "56"
    assert node.status.allocatable["nvidia.com/mig-3g.40gb"] == "0"  # kubelet keeps a vanished resource at 0
    gpu = state.cluster("prod").nodes["prod-h100-bal-02"].gpu(0)
    assert sorted((gi.id, gi.start) for gi in gpu.instances.values()) == [(7 + s, s) for s in range(7)]


def test_mig_manager_keeps_matching_gpus_untouched(prod, state):
    node = state.cluster("prod").nodes["prod-h100-bal-02"]
    before = [ci.uuid for g in node.gpus for _, ci in g.mig_devices()]
    prod.patch_node("prod-h100-bal-02", {"metadata": {"labels": {MIG_CONFIG: "all-disabled"}}})
    state.run_mig_manager()
    assert not any(g.mig_enabled for g in node.gpus)
    prod.patch_node("prod-h100-bal-02", {"metadata": {"labels": {MIG_CONFIG: "all-balanced"}}})
    state.run_mig_manager()
    assert node.labels[MIG_STATE] == "success"
    after = [ci.uuid for g in node.gpus for _, ci in g.mig_devices()]
    assert len(after) == len(before) and set(after) != set(before)  # recreated after the disable
    prod.patch_node("prod-h100-bal-02", {"metadata": {"labels": {MIG_CONFIG: "prod-4g-3g"}}})
    prod.patch_node("prod-h100-bal-02", {"metadata": {"labels": {MIG_CONFIG: "all-balanced"}}})
    state.run_mig_manager()  # only the last label value counts, and all-balanced is already applied
    assert [ci.uuid for g in node.gpus for _, ci in g.mig_devices()] == after


def test_unknown_config_fails_and_changes_nothing(prod, state):
    node = state.cluster("prod").nodes["prod-h100-bal-02"]
    layout = [g.layout() for g in node.gpus]
    prod.patch_node("prod-h100-bal-02", {"metadata": {"labels": {MIG_CONFIG: "no-such-config"}}})
    state.run_mig_manager()
    assert prod.read_node("prod-h100-bal-02").metadata.labels[MIG_STATE] == "failed"
    assert [g.layout() for g in node.gpus] == layout
    assert "not found" in node.mig_message


def test_refuses_while_gpu_pods_run(prod, state):
    prod.patch_node("prod-h100-bal-01", {"metadata": {"labels": {MIG_CONFIG: "all-7g.80gb"}}})
    state.run_mig_manager()
    node = state.cluster("prod").nodes["prod-h100-bal-01"]
    assert node.labels[MIG_STATE] == "failed"
    assert "team-vision/detector" in node.mig_message
    prod.delete_namespaced_pod("detector", "team-vision")
    prod.patch_node("prod-h100-bal-01", {"metadata": {"labels": {MIG_CONFIG: None}}})
    prod.patch_node("prod-h100-bal-01", {"metadata": {"labels": {MIG_CONFIG: "all-7g.80gb"}}})
    state.run_mig_manager()
    assert node.labels[MIG_STATE] == "success"
    assert prod.read_node("prod-h100-bal-01").status.allocatable["nvidia.com/mig-7g.80gb"] == "8"


def test_gpuaas_configmap_wins_and_invalid_layouts_fail(prod, state):
    document = {
        "version": "v1",
        "mig-configs": {
            "gpuaas-2x3g": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}],
            "gpuaas-too-big": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 3}}],
            "gpuaas-wrong-gpu": [
                {"device-filter": "0x233510DE", "devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 7}}
            ],
        },
    }
    prod.create_namespaced_config_map(
        "gpu-operator",
        {"metadata": {"name": "gpuaas-mig-parted-config"}, "data": {"config.yaml": yaml.safe_dump(document)}},
    )
    node = state.cluster("prod").nodes["prod-h100-bal-02"]
    for config, outcome in [
        ("gpuaas-too-big", "failed"),
        ("gpuaas-wrong-gpu", "failed"),
        ("all-balanced", "failed"),
        ("gpuaas-2x3g", "success"),
    ]:
        prod.patch_node("prod-h100-bal-02", {"metadata": {"labels": {MIG_CONFIG: config}}})
        state.run_mig_manager()
        assert node.labels[MIG_STATE] == outcome, (config, node.mig_message)
    assert node.gpu(3).layout() == ["3g.40gb", "3g.40gb"]
    assert prod.read_node("prod-h100-bal-02").metadata.labels["nvidia.com/mig-3g.40gb.count"] == "16"


def test_cluster_policy_config_name_is_read(prod, state):
    state.cluster("prod").settings.mig_config_name = "site-mig-config"
    document = {
        "version": "v1",
        "mig-configs": {"site-7g": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}]},
    }
    prod.create_namespaced_config_map(
        "gpu-operator", {"metadata": {"name": "site-mig-config"}, "data": {"config.yaml": yaml.safe_dump(document)}}
    )
    prod.patch_node("prod-h100-full-02", {"metadata": {"labels": {MIG_CONFIG: "site-7g"}}})
    state.run_mig_manager()
    node = prod.read_node("prod-h100-full-02")
    assert node.metadata.labels[MIG_STATE] == "success"
    assert node.status.allocatable["nvidia.com/mig-7g.80gb"] == "2"
    assert node.status.allocatable["nvidia.com/gpu"] == "6"


# --- device plugin sharing -----------------------------------------------------------------


def test_device_plugin_config_label_switches_sharing(prod):
    sharing = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}
    renamed = {
        "version": "v1",
        "sharing": {
            "timeSlicing": {
                "renameByDefault": True,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "gpu", "replicas": 2}],
            }
        },
    }
    prod.create_namespaced_config_map(
        "gpu-operator",
        {
            "metadata": {"name": "time-slicing-config"},
            "data": {"three": yaml.safe_dump(sharing), "renamed": yaml.safe_dump(renamed)},
        },
    )

    def select(key):
        return prod.patch_node("prod-h100-full-02", {"metadata": {"labels": {"nvidia.com/device-plugin.config": key}}})

    node = select("three")
    assert node.status.allocatable["nvidia.com/gpu"] == "24"
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    node = select("nope")
    assert node.status.allocatable["nvidia.com/gpu"] == "24"  # unknown key: reconfiguration skipped
    node = select("renamed")
    assert node.status.allocatable["nvidia.com/gpu.shared"] == "16"
    assert node.status.allocatable["nvidia.com/gpu"] == "0"
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node.metadata.labels["nvidia.com/gpu.replicas"] == "2"
    prod.create_namespace({"metadata": {"name": "batch"}})
    pod = prod.create_namespaced_pod(
        "batch",
        {
            "metadata": {"name": "two"},
            "spec": {
                "nodeName": "prod-h100-full-02",
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}],
            },
        },
    )
    assert (pod.status.phase, pod.status.reason) == ("Failed", "UnexpectedAdmissionError")
    assert "maximum request size for shared resources is 1" in pod.status.message
    # Editing the ConfigMap reconfigures the nodes that use it.
    sharing["sharing"]["timeSlicing"]["resources"][0]["replicas"] = 5
    renamed["sharing"]["timeSlicing"]["resources"][0]["replicas"] = 5
    prod.patch_namespaced_config_map(
        "time-slicing-config", "gpu-operator", {"data": {"renamed": yaml.safe_dump(renamed)}}
    )
    assert prod.read_node("prod-h100-full-02").status.allocatable["nvidia.com/gpu.shared"] == "40"


def test_mig_manager_rejects_bad_label_values_via_the_api(prod):
    with pytest.raises(ApiException) as exc:
        prod.patch_node("prod-h100-bal-02", {"metadata": {"labels": {MIG_CONFIG: "has space"}}})
    assert exc.value.status == 422
