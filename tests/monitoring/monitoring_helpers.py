"""Helpers of the monitoring tests: a small fleet of ORM rows, allocations, sample writers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from capacity.choices import SpecKind
from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity
from monitoring.services.ingest import ingest_samples, sample_row, series_ids

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


@dataclass
class Fleet:
    cluster: Cluster
    node: NodeCapacity
    mig_gpu: GpuCapacity  # H100, MIG: 3g.40gb @4 (GI 2), 2g.20gb @0 (GI 3), 1g.10gb @2 (GI 9)
    full_gpu: GpuCapacity  # H100, no MIG
    mig_3g: MigInstance
    mig_2g: MigInstance
    mig_1g: MigInstance


def _instance(gpu, name, start, gi_id, uuid):
    profile = MigProfile.objects.get(product="H100-80GB", name=name)
    placement = profile.valid_placements.get(start=start)
    return MigInstance.objects.create(
        gpu=gpu,
        profile=profile,
        placement=placement,
        placement_start=start,
        placement_size=placement.size,
        gi_id=gi_id,
        ci_id=0,
        uuid=uuid,
    )


def build_fleet() -> Fleet:
    cluster = Cluster.objects.create(name="c1", kubeconfig_path="/tmp/c1.kubeconfig")
    node = NodeCapacity.objects.create(cluster=cluster, name="gpu-node-01", gpu_count=2, ready=True)
    common = {"node": node, "product": "NVIDIA H100 80GB HBM3", "catalog_product": "H100-80GB", "memory_mib": 81559}
    mig_gpu = GpuCapacity.objects.create(index=0, uuid="GPU-0000-aaaa", mig_mode_current=True, **common)
    full_gpu = GpuCapacity.objects.create(index=1, uuid="GPU-0001-bbbb", **common)
    return Fleet(
        cluster=cluster,
        node=node,
        mig_gpu=mig_gpu,
        full_gpu=full_gpu,
        mig_3g=_instance(mig_gpu, "3g.40gb", 4, 2, "MIG-3g-0000"),
        mig_2g=_instance(mig_gpu, "2g.20gb", 0, 3, "MIG-2g-0000"),
        mig_1g=_instance(mig_gpu, "1g.10gb", 2, 9, "MIG-1g-0000"),
    )


def write(series_id: int, ts: datetime, **values) -> None:
    """One sample row through the real ingest path."""
    ingest_samples([sample_row(series_id, ts, values)])


def series_of(gpu, mig=None) -> int:
    key = (gpu.pk, mig.pk if mig is not None else None)
    return series_ids([key])[key]


def every(start: datetime, count: int, seconds: int = 30):
    return [start + timedelta(seconds=seconds * i) for i in range(count)]


def allocate(project, unit, *, at: datetime = T0 - timedelta(days=2), released_at=None, pool=None):
    """An Allocation of a MIG instance or a full GPU to `project` (with its request and pool)."""
    from pools.models import Allocation, GpuPool, PoolRequest

    gpu = unit.gpu if isinstance(unit, MigInstance) else unit
    if pool is None:
        request = PoolRequest.objects.create(project=project, name="req", cluster=gpu.node.cluster)
        pool = GpuPool.objects.create(
            project=project,
            request=request,
            cluster=gpu.node.cluster,
            name=f"pool-{request.pk}",
            workload_type="inference",
        )
    if isinstance(unit, MigInstance):
        fields = {
            "kind": SpecKind.MIG,
            "mig_instance": unit,
            "resource_name": unit.profile.resource_name,
            "profile_name": unit.profile.name,
            "compute_slices": unit.profile.compute_slices,
        }
    else:
        fields = {"kind": SpecKind.FULL, "resource_name": "nvidia.com/gpu", "compute_slices": 7}
    return Allocation.objects.create(
        pool=pool,
        project=project,
        gpu=gpu,
        product=gpu.catalog_product,
        allocated_at=at,
        released_at=released_at,
        **fields,
    )
