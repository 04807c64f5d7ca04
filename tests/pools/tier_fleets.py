"""Fleets for the tier plan's tests: nodes of any tier and use (MIG layouts incl. the 1g/2g slices the tier-1
policy refuses, whole GPUs, time-slicing, MPS, vGPU), on two clusters, with id sequences shifted so that no
GPU, node, instance or cluster shares an id by accident."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from capacity.adapters.kubernetes import parse_node
from capacity.choices import SharingStrategy, Tier
from capacity.models import (
    Cluster,
    SpecAndCount,
    TierProfilePolicy,
)
from capacity.services import node_labels
from capacity.vgpu import VGPU_CONFIG_LABEL, VGPU_TYPES, VM_VGPU, WORKLOAD_CONFIG_LABEL

# Per product, per-GPU MIG layouts, including the 1g/2g slices the tier-1 policy refuses.
LAYOUTS = {
    "H100-80GB": [
        ["4g.40gb", "3g.40gb"],
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        ["7g.80gb"],
        ["2g.20gb", "2g.20gb", "2g.20gb"],
        ["1g.10gb"] * 7,
    ],
    "H200-141GB": [["4g.71gb", "3g.71gb"], ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"], ["7g.141gb"], ["1g.18gb"] * 7],
    "A100-40GB": [["4g.20gb", "3g.20gb"], ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"], ["7g.40gb"], ["2g.10gb"] * 3],
}
VGPU_OF = {"H100-80GB": ["H100XM-40C", "H100XM-20C"], "A100-40GB": ["A100-20C", "A100-10C"]}
USES = ["mig", "full", "timeslice", "mps", "vgpu"]
STATES = ["ok", "ok", "ok", "cordoned", "unhealthy"]


@dataclass(frozen=True)
class NodeSpec:
    cluster: int
    product: str
    tier: str
    use: str
    gpus: int
    layouts: tuple[int, ...]
    replicas: int
    vgpu: int
    state: str


node_specs = st.builds(
    NodeSpec,
    cluster=st.integers(0, 1),
    product=st.sampled_from(sorted(LAYOUTS)),
    tier=st.sampled_from(Tier.values),
    use=st.sampled_from(USES),
    gpus=st.integers(1, 2),
    layouts=st.lists(st.integers(0, 4), min_size=2, max_size=2).map(tuple),
    replicas=st.integers(2, 3),
    vgpu=st.integers(0, 1),
    state=st.sampled_from(STATES),
)
fleets = st.fixed_dictionaries(
    {
        "nodes": st.lists(node_specs, min_size=1, max_size=4),
        "pad": st.tuples(st.integers(0, 3), st.integers(0, 5)),  # spare clusters and gone nodes: ids differ
        "tier2_min": st.sampled_from([1, 2, 3]),  # tier 2's policy, edited: the plan reads the rows
    }
)


def _pad(rows, clusters: int, nodes: int) -> None:
    """Rows that shift the id sequences, so no GPU, node, instance or cluster shares an id by accident."""
    base = Cluster.objects.count()
    spare = [rows.cluster(f"spare-{base + i}") for i in range(clusters)] or [rows.cluster(f"spare-{base}")]
    for i in range(nodes):
        rows.node(f"gone-{base}-{i}", cluster=spare[0].name, gone_at="2026-01-01T00:00Z")


def _discovered_specs(node, spec: NodeSpec, use: str) -> None:
    """The node's SpecAndCount rows as discovery derives them (node_specs) from the labels and extended resources
    its device plugin would show. A vm-vgpu node is configured (nvidia.com/vgpu.config) for one of its product's
    two types and its plugin advertises both, the other still listed: with `spec.vgpu` 0 the configured type is
    not the first advertised. A shared node's replicas are MPS clients when its sharing strategy is MPS."""
    labels = {"nvidia.com/gpu.product": node.gpu_product, "nvidia.com/gpu.count": str(spec.gpus)}
    if use == "vgpu":
        configured, other = VGPU_OF[spec.product][spec.vgpu], VGPU_OF[spec.product][1 - spec.vgpu]
        labels |= {WORKLOAD_CONFIG_LABEL: VM_VGPU, VGPU_CONFIG_LABEL: configured}
        resources = {
            VGPU_TYPES[t].resource_name: str(spec.gpus * VGPU_TYPES[t].max_per_gpu) for t in (other, configured)
        }
        node.labels = labels
        node.save(update_fields=["labels"])
    else:
        labels |= {
            "nvidia.com/gpu.replicas": str(spec.replicas),
            "nvidia.com/gpu.sharing-strategy": node.sharing_strategy,
        }
        resources = {"nvidia.com/gpu": str(spec.gpus * spec.replicas)}
    raw = {
        "metadata": {"name": node.name, "labels": labels},
        "status": {"capacity": resources, "allocatable": resources},
    }
    kube_node = parse_node(raw)
    for found in node_labels.node_specs(kube_node, node_labels.node_values(kube_node)):
        SpecAndCount.objects.create(
            node=node,
            kind=found.kind,
            product=found.product,
            profile_name=found.profile_name,
            resource_name=found.resource_name,
            count=found.count,
            allocatable=found.allocatable,
            replicas=found.replicas,
        )


def build_fleet(rows, fleet: dict, prefix: str = "c") -> None:
    """The fleet's nodes on two clusters, `{prefix}0` and `{prefix}1`, written through `rows` (the pools tests'
    Fleet, tests/pool_world.py, which records rows as discovery would)."""
    clusters = [rows.cluster(f"{prefix}{i}") for i in range(2)]
    _pad(rows, *fleet["pad"])
    TierProfilePolicy.objects.filter(tier=Tier.STAGING).update(min_compute_slices=fleet["tier2_min"])
    for n, spec in enumerate(fleet["nodes"]):
        layouts = LAYOUTS[spec.product]
        use = "timeslice" if spec.use == "vgpu" and spec.product not in VGPU_OF else spec.use
        node = rows.node(
            f"{prefix}-n{n}-{use}",
            cluster=clusters[spec.cluster].name,
            tier=spec.tier,
            product=spec.product,
            replicas=spec.replicas if use in ("timeslice", "mps") else 1,
            mig=use == "mig",
            cordoned=spec.state == "cordoned",
            sharing_strategy=SharingStrategy.MPS if use == "mps" else SharingStrategy.TIME_SLICING,
        )
        if use in ("vgpu", "timeslice", "mps"):
            _discovered_specs(node, spec, use)
        for index in range(spec.gpus):
            health = "unhealthy" if spec.state == "unhealthy" and index == 0 else "ok"
            if use == "mig":
                rows.mig_gpu(
                    node, index, layouts[spec.layouts[index] % len(layouts)], product=spec.product, health=health
                )
            else:
                rows.gpu(node, index, product=spec.product, health=health)
