"""Fleets for the tier plan's tests: nodes of any tier and use (MIG layouts incl. the 1g/2g slices the tier-1
policy refuses, whole GPUs, time-slicing, MPS, vGPU), on two clusters, with id sequences shifted so that no
GPU, node, instance or cluster shares an id by accident."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from capacity.choices import SharingStrategy, SpecKind, Tier
from capacity.mig.catalog import get_product
from capacity.mig.layout import validate_layout
from capacity.models import (
    Cluster,
    GpuCapacity,
    MigInstance,
    MigProfile,
    NodeCapacity,
    SpecAndCount,
    TierProfilePolicy,
)
from capacity.vgpu import VGPU_TYPES

# Per product: GFD name, and per-GPU MIG layouts, including the 1g/2g slices the tier-1 policy refuses.
PRODUCTS = {
    "H100-80GB": (
        "NVIDIA-H100-80GB-HBM3",
        [
            ["4g.40gb", "3g.40gb"],
            ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            ["7g.80gb"],
            ["2g.20gb", "2g.20gb", "2g.20gb"],
            ["1g.10gb"] * 7,
        ],
    ),
    "H200-141GB": (
        "NVIDIA-H200",
        [["4g.71gb", "3g.71gb"], ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"], ["7g.141gb"], ["1g.18gb"] * 7],
    ),
    "A100-40GB": (
        "NVIDIA-A100-SXM4-40GB",
        [["4g.20gb", "3g.20gb"], ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"], ["7g.40gb"], ["2g.10gb"] * 3],
    ),
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
    product=st.sampled_from(sorted(PRODUCTS)),
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


def _pad(clusters: int, nodes: int) -> None:
    """Rows that shift the id sequences, so no GPU, node, instance or cluster shares an id by accident."""
    base = Cluster.objects.count()
    spare = [
        Cluster.objects.create(name=f"spare-{base + i}", kubeconfig_path="/tmp/x", status="ok") for i in range(clusters)
    ]
    for i in range(nodes):
        NodeCapacity.objects.create(
            cluster=spare[0] if spare else Cluster.objects.first(), name=f"gone-{base}-{i}", gone_at="2026-01-01T00:00Z"
        )


def build_fleet(fleet: dict, prefix: str = "c") -> None:
    """Two clusters, `{prefix}0` and `{prefix}1`, with the fleet's nodes."""
    clusters = [
        Cluster.objects.create(name=f"{prefix}{i}", kubeconfig_path=f"/tmp/{prefix}{i}", status="ok") for i in range(2)
    ]
    _pad(*fleet["pad"])
    TierProfilePolicy.objects.filter(tier=Tier.STAGING).update(min_compute_slices=fleet["tier2_min"])
    for n, spec in enumerate(fleet["nodes"]):
        gfd, layouts = PRODUCTS[spec.product]
        use = "timeslice" if spec.use == "vgpu" and spec.product not in VGPU_OF else spec.use
        node = NodeCapacity.objects.create(
            cluster=clusters[spec.cluster],
            name=f"{prefix}-n{n}-{use}",
            gpu_product=gfd,
            gpu_count=spec.gpus,
            ready=True,
            cordoned=spec.state == "cordoned",
            tier=spec.tier,
            mig_strategy="mixed" if use == "mig" else "none",
            timeslice_replicas=spec.replicas if use in ("timeslice", "mps") else 1,
            sharing_strategy=SharingStrategy.MPS if use == "mps" else SharingStrategy.TIME_SLICING,
        )
        if use == "vgpu":
            vgpu = VGPU_TYPES[VGPU_OF[spec.product][spec.vgpu]]
            SpecAndCount.objects.create(
                node=node,
                kind=SpecKind.VGPU,
                product=spec.product,
                profile_name=vgpu.name,
                resource_name=vgpu.resource_name,
                count=spec.gpus * vgpu.max_per_gpu,
                allocatable=spec.gpus * vgpu.max_per_gpu,
                replicas=vgpu.max_per_gpu,
            )
        for index in range(spec.gpus):
            gpu = GpuCapacity.objects.create(
                node=node,
                index=index,
                uuid=f"GPU-{node.name}-{index}",
                product=gfd,
                catalog_product=spec.product,
                memory_mib=get_product(spec.product).memory_mib,
                mig_mode_current=use == "mig",
                mig_mode_pending=use == "mig",
                health="unhealthy" if spec.state == "unhealthy" and index == 0 else "ok",
            )
            if use == "mig":
                names = layouts[spec.layouts[index] % len(layouts)]
                result = validate_layout(spec.product, names)
                assert result.valid, result.reason
                for placement in result.placements:
                    profile = MigProfile.objects.get(product=spec.product, name=placement.profile)
                    MigInstance.objects.create(
                        gpu=gpu,
                        profile=profile,
                        placement=profile.valid_placements.get(start=placement.start),
                        placement_start=placement.start,
                        placement_size=placement.size,
                        uuid=f"MIG-{gpu.uuid}-{placement.start}",
                    )
