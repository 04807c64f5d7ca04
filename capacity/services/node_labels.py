"""Reading a GPU node's labels and status into what discovery stores (pure functions, no database).

The labels are the GPU Operator's and GFD's (nvidia.com/*) and gpuaas' own (gpuaas.io/*); node_values() and
node_specs() derive a NodeCapacity's fields and its SpecAndCount rows, and fingerprint() says when a node
changed. Discovery (services/discovery.py) writes what they derive."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass

from capacity.adapters import kubernetes as kube
from capacity.choices import MigStrategy, SharingStrategy, SpecKind, Tier
from capacity.mig.catalog import Product, find_product
from capacity.models import NodeCapacity
from capacity.vgpu import VGPU_CONFIG_LABEL, VGPU_CONFIG_STATE_LABEL, configured_types, vgpu_type_for_resource

logger = logging.getLogger(__name__)

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"
TIER_LABEL = "gpuaas.io/tier"
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
NODE_GROUP_LABEL = "gpuaas.io/node-group"
VOLATILE_LABELS = frozenset({"nvidia.com/gfd.timestamp"})
RESOURCE_PREFIX = "nvidia.com/"
RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_MIG_PREFIX = "nvidia.com/mig-"
SHARED_SUFFIX = ".shared"


# The NodeCapacity fields discovery owns, in the order they are compared.
NODE_FIELDS = (
    "gpu_product",
    "gpu_count",
    *NodeCapacity.LABELLED_FIELDS,
    "timeslice_replicas",
    "sharing_strategy",
    "ready",
    "cordoned",
    "labels",
    "capacity",
    "allocatable",
)
SPEC_FIELDS = ("kind", "product", "profile_id", "profile_name", "count", "allocatable", "replicas")
# Bump when node_values()/node_specs() change what they derive, so every node is rewritten once.
FINGERPRINT_VERSION = "3"
_STRATEGIES = frozenset(MigStrategy.values)
_TIERS = frozenset(Tier.values)


# --- Reading labels and status: pure functions --------------------------------------------


def _int(value, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _sharing_strategy(label: str, replicas: int) -> str:
    """GFD's sharing-strategy label ("none" when not shared); older GFDs without it: time-slicing if replicated."""
    if label in SharingStrategy.values:
        return label
    return SharingStrategy.TIME_SLICING if replicas > 1 and not label else ""


def is_gpu_node(node: kube.Node) -> bool:
    labels = node.labels
    if labels.get(GPU_PRESENT_LABEL) == "true" or GPU_COUNT_LABEL in labels:
        return True
    return any(name.startswith(RESOURCE_PREFIX) for name in node.capacity)


def _single_mig_profile(product_label: str) -> str:
    """The profile of a single-strategy product label "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb" ("" if none)."""
    if "-MIG-" not in product_label:
        return ""
    profile = product_label.split("-MIG-", 1)[1]
    return profile[: -len("-SHARED")] if profile.endswith("-SHARED") else profile


def fingerprint(node: kube.Node) -> str:
    """Hash of everything node_values()/node_specs() read from a node (volatile labels excluded)."""
    labels = {k: v for k, v in node.labels.items() if k not in VOLATILE_LABELS}
    payload = [labels, node.capacity, node.allocatable, node.unschedulable, node.ready]
    # Key order as the API server sends it (Go sorts map keys): a reordering costs one identical rewrite.
    digest = hashlib.blake2b(json.dumps(payload).encode(), digest_size=15).hexdigest()
    return f"{FINGERPRINT_VERSION}:{digest}"


def node_values(node: kube.Node) -> dict:
    """The NodeCapacity field values discovery derives from one Kubernetes node."""
    labels = {k: v for k, v in node.labels.items() if k not in VOLATILE_LABELS}
    strategy = labels.get(MIG_STRATEGY_LABEL, MigStrategy.NONE)
    if strategy not in _STRATEGIES:
        strategy = MigStrategy.NONE
    product_label = labels.get(GPU_PRODUCT_LABEL, "")
    replicas = max(1, _int(labels.get(GPU_REPLICAS_LABEL), 1))
    gpu_count = _int(labels.get(GPU_COUNT_LABEL), 0)
    gpu_memory = _int(labels.get(GPU_MEMORY_LABEL), 0)
    single_profile = _single_mig_profile(product_label) if strategy == MigStrategy.SINGLE else ""
    if single_profile:
        # GFD counts MIG devices under the single strategy; estimate physical GPUs from the profile's
        # per-GPU maximum (the only layouts "single" allows are all-<profile>). NVML rows are exact.
        parent = find_product(product_label)
        per_gpu = _profile_max(parent, single_profile)
        gpu_count = math.ceil(gpu_count / per_gpu) if per_gpu else gpu_count
        # gpu.memory is the MIG device's there too (tests/fixtures/gfd/a100-80gb-pcie-single.json); the
        # field holds a physical GPU's, as gpu_count counts physical GPUs.
        gpu_memory = parent.memory_mib if parent else gpu_memory
    elif not gpu_count and replicas == 1:
        gpu_count = _int(node.capacity.get(RESOURCE_GPU), 0)
    tier = labels.get(TIER_LABEL, "")
    return {
        "gpu_product": product_label[:100],
        "gpu_count": min(gpu_count, 32767),
        "gpu_memory_mib": gpu_memory,
        "tier": tier if tier in _TIERS else Tier.NONE,
        "node_group": labels.get(NODE_GROUP_LABEL, "")[:100],
        "mig_strategy": strategy,
        "mig_config": labels.get(MIG_CONFIG_LABEL, "")[:100],
        "mig_config_state": labels.get(MIG_CONFIG_STATE_LABEL, "")[:16],
        "timeslice_replicas": min(replicas, 32767),
        "sharing_strategy": _sharing_strategy(labels.get(SHARING_STRATEGY_LABEL, ""), replicas),
        "ready": node.ready,
        "cordoned": node.unschedulable,
        "labels": labels,
        "capacity": node.capacity,
        "allocatable": node.allocatable,
    }


def _profile_max(parent: Product | None, name: str) -> int:
    if parent is None:
        return 0
    try:
        profile = parent.profile(name)
    except KeyError:
        return 0
    return min(profile.max_instances, parent.compute_slices // profile.compute_slices)


@dataclass(frozen=True, slots=True, order=True)
class Spec:
    """One extended resource a node offers (a SpecAndCount row before the profile FK is resolved)."""

    resource_name: str
    kind: str
    product: str
    profile_name: str
    count: int
    allocatable: int
    replicas: int


def node_specs(node: kube.Node, values: dict) -> list[Spec]:
    """What the node offers, by nvidia.com/* resource; MIG profiles unknown to the catalog are skipped."""
    labels = values["labels"]
    product_label = values["gpu_product"]
    parent = find_product(product_label) if product_label else None
    product = parent.key if parent else product_label.split("-MIG-", 1)[0].removesuffix("-SHARED")
    specs = []
    for resource, raw in node.capacity.items():
        if not resource.startswith(RESOURCE_PREFIX):
            continue
        count = _int(raw, 0)
        allocatable = _int(node.allocatable.get(resource), 0)
        if count == 0 and allocatable == 0:
            continue  # kubelet keeps a resource at 0 after its devices went away
        base = resource[: -len(SHARED_SUFFIX)] if resource.endswith(SHARED_SUFFIX) else resource
        profile_name = ""
        if base == RESOURCE_GPU:
            replicas = max(1, _int(labels.get(GPU_REPLICAS_LABEL), 1))
            single_profile = _single_mig_profile(product_label) if values["mig_strategy"] == "single" else ""
            if single_profile:
                kind, profile_name = SpecKind.MIG, single_profile
            else:
                kind = SpecKind.TIMESLICE if replicas > 1 or base != resource else SpecKind.FULL
                if kind == SpecKind.TIMESLICE and values["sharing_strategy"] == SharingStrategy.MPS:
                    # The device plugin's config shares through `sharing.mps` (GFD labels the node
                    # nvidia.com/gpu.sharing-strategy=mps): its replicas are MPS clients, their own unit kind.
                    kind = SpecKind.MPS
        elif base.startswith(RESOURCE_MIG_PREFIX):
            kind, profile_name = SpecKind.MIG, base[len(RESOURCE_MIG_PREFIX) :]
            replicas = max(1, _int(labels.get(f"{base}.replicas"), 1))
        elif (vgpu := vgpu_type_for_resource(resource)) is not None:
            # A vm-vgpu node: the sandbox device plugin advertises each vGPU type as its own resource. The node's
            # offer is its configured types (nvidia.com/vgpu.config -> the device manager config's types and
            # vGPUs per GPU); a type still advertised after the label moved on is being torn down (unless the
            # device manager reported the change failed).
            configured = configured_types(labels.get(VGPU_CONFIG_LABEL, ""))
            if labels.get(VGPU_CONFIG_STATE_LABEL) == "failed":
                configured = None  # the change did not happen: what is advertised is what the GPUs carry
            if configured is not None and vgpu.name not in configured:
                logger.info("%s: %s advertised but the node is configured for %s", node.name, resource, configured)
                continue
            per_gpu = configured[vgpu.name] if configured else vgpu.max_per_gpu
            specs.append(Spec(resource, SpecKind.VGPU, vgpu.product, vgpu.name, count, allocatable, per_gpu))
            continue
        else:
            continue
        if kind == SpecKind.MIG:
            try:
                profile_name = parent.profile(profile_name).name if parent else ""
            except KeyError:
                profile_name = ""
            if not profile_name:
                logger.warning("%s: %s is not a MIG profile of %r; not recorded", node.name, resource, product)
                continue
        specs.append(Spec(resource, kind, product[:32], profile_name, count, allocatable, min(replicas, 32767)))
    return specs
