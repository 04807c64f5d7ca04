"""What discovery reads from one Kubernetes node: pure functions over hand-made node JSON."""

from capacity.adapters.kubernetes import parse_node, parse_pod
from capacity.services.node_labels import Spec, fingerprint, is_gpu_node, node_specs, node_values


def node_json(labels=None, capacity=None, allocatable=None, *, ready="True", unschedulable=False, rv="7"):
    return {
        "metadata": {"name": "gpu-1", "uid": "u-1", "resourceVersion": rv, "labels": labels or {}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "capacity": capacity or {},
            "allocatable": allocatable if allocatable is not None else (capacity or {}),
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}],
        },
    }


H100 = "NVIDIA-H100-80GB-HBM3"


def test_full_gpu_node_values_and_specs():
    node = parse_node(
        node_json(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": H100,
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.replicas": "1",
                "gpuaas.io/tier": "full",
                "gpuaas.io/node-group": "train",
                "nvidia.com/gfd.timestamp": "1767225600",
            },
            {"cpu": "224", "nvidia.com/gpu": "8"},
            {"cpu": "223500m", "nvidia.com/gpu": "7"},
        )
    )
    values = node_values(node)
    assert is_gpu_node(node)
    assert {k: values[k] for k in values if k not in ("labels", "capacity", "allocatable")} == {
        "gpu_product": H100,
        "gpu_count": 8,
        "gpu_memory_mib": 81559,
        "tier": "full",
        "node_group": "train",
        "mig_strategy": "none",
        "mig_config": "",
        "mig_config_state": "",
        "timeslice_replicas": 1,
        "sharing_strategy": "",
        "ready": True,
        "cordoned": False,
    }
    assert "nvidia.com/gfd.timestamp" not in values["labels"]
    assert node_specs(node, values) == [Spec("nvidia.com/gpu", "full", "H100-80GB", "", 8, 7, 1)]


def test_mixed_mig_node_offers_each_profile_and_its_remaining_full_gpus():
    node = parse_node(
        node_json(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": H100,
                "nvidia.com/gpu.count": "8",
                "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig.config": "all-balanced",
                "nvidia.com/mig.config.state": "success",
                "gpuaas.io/tier": "1",
            },
            {
                "nvidia.com/gpu": "2",
                "nvidia.com/mig-1g.10gb": "12",
                "nvidia.com/mig-3g.40gb": "6",
                "nvidia.com/mig-1g.10gb.me": "1",
                "nvidia.com/mig-2g.20gb": "0",
            },
        )
    )
    values = node_values(node)
    assert (values["mig_strategy"], values["mig_config"], values["mig_config_state"], values["tier"]) == (
        "mixed",
        "all-balanced",
        "success",
        "1",
    )
    assert sorted(node_specs(node, values)) == [
        Spec("nvidia.com/gpu", "full", "H100-80GB", "", 2, 2, 1),
        Spec("nvidia.com/mig-1g.10gb", "mig", "H100-80GB", "1g.10gb", 12, 12, 1),
        Spec("nvidia.com/mig-1g.10gb.me", "mig", "H100-80GB", "1g.10gb+me", 1, 1, 1),
        Spec("nvidia.com/mig-3g.40gb", "mig", "H100-80GB", "3g.40gb", 6, 6, 1),
    ]  # a resource kubelet keeps at 0 after a reconfiguration is not offered


def test_single_strategy_offers_the_profile_as_nvidia_gpu_and_estimates_physical_gpus():
    node = parse_node(
        node_json(
            {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
                "nvidia.com/gpu.count": "16",
                "nvidia.com/mig.strategy": "single",
            },
            {"nvidia.com/gpu": "16"},
        )
    )
    values = node_values(node)
    assert values["gpu_count"] == 8  # GFD counts MIG devices under "single": 2 x 3g.40gb per GPU
    assert node_specs(node, values) == [Spec("nvidia.com/gpu", "mig", "H100-80GB", "3g.40gb", 16, 16, 1)]


def test_time_slicing_renamed_and_not_renamed():
    plain = parse_node(
        node_json(
            {
                "nvidia.com/gpu.product": "NVIDIA-H200-SHARED",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.replicas": "4",
                "gpuaas.io/tier": "3",
            },
            {"nvidia.com/gpu": "32"},
        )
    )
    renamed = parse_node(
        node_json(
            {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "4"},
            {"nvidia.com/gpu.shared": "32"},
        )
    )
    assert node_values(plain)["timeslice_replicas"] == 4
    assert node_specs(plain, node_values(plain)) == [Spec("nvidia.com/gpu", "timeslice", "H200-141GB", "", 32, 32, 4)]
    assert node_specs(renamed, node_values(renamed)) == [
        Spec("nvidia.com/gpu.shared", "timeslice", "H200-141GB", "", 32, 32, 4)
    ]


def test_unknown_product_keeps_its_gfd_name_and_skips_mig_profiles_it_cannot_place():
    node = parse_node(
        node_json(
            {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "gpuaas.io/tier": "gold"},
            {"nvidia.com/gpu": "4", "nvidia.com/mig-1g.12gb": "2"},
        )
    )
    values = node_values(node)
    assert values["tier"] == ""  # not a tier gpuaas knows
    assert node_specs(node, values) == [Spec("nvidia.com/gpu", "full", "NVIDIA-L40S", "", 4, 4, 1)]


def test_not_ready_cordoned_and_which_nodes_are_gpu_nodes():
    cpu_only = parse_node(node_json({"kubernetes.io/hostname": "cpu-1"}, {"cpu": "64"}))
    by_resource = parse_node(node_json({}, {"nvidia.com/gpu": "1"}))
    sick = parse_node(node_json({"nvidia.com/gpu.count": "8"}, ready="Unknown", unschedulable=True))
    assert (is_gpu_node(cpu_only), is_gpu_node(by_resource), is_gpu_node(sick)) == (False, True, True)
    assert (node_values(sick)["ready"], node_values(sick)["cordoned"]) == (False, True)


def test_fingerprint_ignores_the_gfd_timestamp_and_resource_version_but_sees_real_changes():
    base = {"nvidia.com/gpu.count": "8", "nvidia.com/gfd.timestamp": "1"}
    one = fingerprint(parse_node(node_json(base, {"nvidia.com/gpu": "8"}, rv="1")))
    later = fingerprint(
        parse_node(node_json({**base, "nvidia.com/gfd.timestamp": "2"}, {"nvidia.com/gpu": "8"}, rv="2"))
    )
    relabelled = fingerprint(parse_node(node_json({**base, "gpuaas.io/tier": "1"}, {"nvidia.com/gpu": "8"})))
    drained = fingerprint(parse_node(node_json(base, {"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "7"})))
    cordoned = fingerprint(parse_node(node_json(base, {"nvidia.com/gpu": "8"}, unschedulable=True)))
    assert one == later
    assert len({one, relabelled, drained, cordoned}) == 4


def test_pod_requests_count_extended_resources_and_init_containers():
    pod = parse_pod(
        {
            "metadata": {
                "namespace": "team-a",
                "name": "p",
                "uid": "pod-1",
                "annotations": {"gpuaas.io/device-ids": "MIG-a,MIG-b"},
            },
            "spec": {
                "nodeName": "gpu-1",
                "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "3"}}}],
                "containers": [
                    {"resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}, "requests": {"memory": "1Gi"}}},
                    {"resources": {"requests": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "2"}}},
                ],
            },
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"},
        }
    )
    assert pod.requests == {"nvidia.com/gpu": 3, "nvidia.com/mig-1g.10gb": 2}
    assert (pod.node_name, pod.phase, pod.finished, pod.deleted) == ("gpu-1", "Running", False, False)


def test_a_node_shared_through_mps_offers_mps_clients_not_time_slices():
    """GFD labels a node whose device plugin config uses `sharing.mps` nvidia.com/gpu.sharing-strategy=mps
    (NVIDIA/k8s-device-plugin docs: "Shared Access to GPUs with CUDA MPS"): its replicas are MPS clients."""
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H200-SHARED",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "mps",
    }
    for resource in ("nvidia.com/gpu", "nvidia.com/gpu.shared"):
        node = parse_node(node_json(labels, {resource: "8"}))
        values = node_values(node)
        assert (values["sharing_strategy"], values["timeslice_replicas"]) == ("mps", 4)
        assert node_specs(node, values) == [Spec(resource, "mps", "H200-141GB", "", 8, 8, 4)]
    sliced = parse_node(
        node_json({**labels, "nvidia.com/gpu.sharing-strategy": "time-slicing"}, {"nvidia.com/gpu": "8"})
    )
    assert [s.kind for s in node_specs(sliced, node_values(sliced))] == ["timeslice"]
