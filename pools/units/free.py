"""Free units: MIG instances, full GPUs, time-slice replicas and vGPUs that could serve a request, by cluster.

A unit is a candidate when it is free (MigInstance.objects.free(), GpuCapacity.objects.free() and
.with_free_replicas(): the one definition of availability, capacity.choices.Availability) and
matches the request (kind, product, profile, tier, cluster).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, Q, Sum

from capacity import picking
from capacity.choices import SpecKind, Tier
from capacity.models import Cluster, GpuCapacity, MigInstance, WorkloadProfile
from capacity.vgpu import VGPU_TYPES, VgpuType

from ..models import PoolRequest
from . import topology

TIMESLICE_RESOURCE = "nvidia.com/gpu"
FULL_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Unit:
    """One unit to allocate, with what the Allocation row records about it."""

    gpu_id: int
    mig_instance_id: int | None
    replica: int
    resource_name: str
    product: str
    profile_name: str
    compute_slices: int
    node_name: str
    cluster_id: int
    locality: tuple = ()  # whole GPUs: the GPU's groups in topology.LOCALITY order, for the pool's placement


@dataclass
class FreeUnits:
    """One read of the units free for a request: per cluster id (`by_cluster`), and for multi-GPU whole-GPU
    work the free GPUs themselves (`gpus`, topology.free_gpus rows), so that approval chooses the cluster,
    the node and the set from one read (then locks, pools/units/take.py). `busy_devices`: the devices of pods
    given several (WorkloadProfile.objects.running().multi_device_uuids()), read once for the approval."""

    by_cluster: dict[int, int]
    busy_devices: frozenset[str] | None = None
    gpus: list[tuple] | None = None


def _product_q(product: str, prefix: str = "") -> Q:
    if not product:
        return Q()
    return (
        Q(**{f"{prefix}catalog_product": product})
        | Q(**{f"{prefix}product": product})
        | Q(**{f"{prefix}node__gpu_product": product})
    )


def _tier_q(request: PoolRequest, allowed: tuple[str, ...], prefix: str = "") -> Q:
    """Nodes of the request's tier or one of `allowed`, and untiered nodes."""
    tiers = {Tier.NONE, *allowed}
    if request.tier:
        tiers.add(request.tier)
    return Q(**{f"{prefix}node__tier__in": sorted(tiers)})


def mig_candidates(request: PoolRequest, busy_devices: frozenset[str] | None = None, *, fleet: bool = False):
    """Free MIG instances (MigInstance.objects.free(), which leaves out those the tier policy withholds)
    of the requested profile, product, tier and cluster. `fleet`: written to be counted whole (read_free)."""
    queryset = MigInstance.objects.free(busy_devices, fleet=fleet).filter(
        _tier_q(request, (), "gpu__"), profile__name=request.profile_name
    )
    if request.product:
        queryset = queryset.filter(profile__product=request.product)
    if request.cluster_id:
        queryset = queryset.filter(gpu__node__cluster_id=request.cluster_id)
    return queryset


def full_candidates(request: PoolRequest, busy_devices: frozenset[str] | None = None, *, fleet: bool = False):
    """Free whole GPUs on nodes without time-slicing, of the training tier or untiered. `fleet`: written to be
    read whole (read_free)."""
    return full_hosts(request, GpuCapacity.objects.free(busy_devices, fleet=fleet))


def full_hosts(request: PoolRequest, gpus=None):
    """Whole GPUs (default: present ones, free or not) of the hosts approval hands out whole
    (GpuCapacity.objects.whole_gpu_hosts(): training or untiered nodes without time-slicing or vGPUs):
    what full_candidates() draws from, and what a node could hold once released."""
    hosts = (GpuCapacity.objects.all() if gpus is None else gpus).whole_gpu_hosts()
    queryset = hosts.filter(_product_q(request.product))
    if request.cluster_id:
        queryset = queryset.filter(node__cluster_id=request.cluster_id)
    return queryset


def request_vgpu(request: PoolRequest) -> VgpuType | None:
    """The vGPU type a vGPU request asks for (its profile_name), or None."""
    return VGPU_TYPES.get(request.profile_name) if request.spec_kind == SpecKind.VGPU else None


def vgpu_candidates(request: PoolRequest):
    """GPUs of vm-vgpu nodes carved into the request's vGPU type with a vGPU not held, annotated `free`.

    A vGPU unit is (GPU, index) like a time-slice replica: the GPU carries vGPUs per GPU of its type
    (equal-size mode, capacity.vgpu), so the same unique constraint on (gpu, replica) guards it.
    """
    vgpu = request_vgpu(request)
    if vgpu is None:
        return GpuCapacity.objects.none()
    queryset = (
        GpuCapacity.objects.vgpu_hosts(vgpu.name)
        .filter(_tier_q(request, (Tier.STAGING,)))
        .with_free_shares(vgpu.max_per_gpu)
    )
    if request.cluster_id:
        queryset = queryset.filter(node__cluster_id=request.cluster_id)
    return queryset


def timeslice_candidates(request: PoolRequest):
    """GPUs of time-sliced nodes with at least one replica not held, annotated `free`."""
    # An MPS request takes replicas of MPS nodes only; a time-slice request those of other nodes.
    hosts = GpuCapacity.objects.timeslice_hosts(mps=request.spec_kind == SpecKind.MPS)
    queryset = hosts.with_free_shares().filter(_product_q(request.product), _tier_q(request, (Tier.DEVELOPMENT,)))
    if request.cluster_id:
        queryset = queryset.filter(node__cluster_id=request.cluster_id)
    return queryset


def free_by_cluster(request: PoolRequest) -> dict[int, int]:
    """Free units per cluster id, for the request's spec."""
    return read_free(request).by_cluster


def read_free(request: PoolRequest, busy_devices: frozenset[str] | None = None) -> FreeUnits:
    """The units free for the request's spec (FreeUnits): two queries for MIG and whole GPUs (the busy
    devices, unless the caller read them already as `busy_devices`, then the units), one for shares
    (time-slice replicas, vGPUs)."""
    busy = busy_devices
    if busy is None and request.spec_kind in (SpecKind.MIG, SpecKind.FULL):
        busy = WorkloadProfile.objects.running().multi_device_uuids()
    # Every free unit of the spec is counted (best fit needs the counts): with hashed subqueries (fleet=True),
    # one pass over the holders instead of an index probe per unit.
    if request.spec_kind == SpecKind.MIG:
        rows = mig_candidates(request, busy, fleet=True).values("gpu__node__cluster").annotate(n=Count("pk"))
        return FreeUnits({r["gpu__node__cluster"]: r["n"] for r in rows.order_by()}, busy)
    if topology.one_node(request):
        gpus = topology.free_gpus(full_candidates(request, busy, fleet=True))
        return FreeUnits(topology.best_per_cluster(topology.by_node(gpus)), busy, gpus)
    if request.spec_kind == SpecKind.FULL:
        rows = full_candidates(request, busy, fleet=True).values("node__cluster").annotate(n=Count("pk"))
        return FreeUnits({r["node__cluster"]: r["n"] for r in rows.order_by()}, busy)
    queryset = vgpu_candidates(request) if request.spec_kind == SpecKind.VGPU else timeslice_candidates(request)
    rows = queryset.values("node__cluster").annotate(n=Sum("free"))
    return FreeUnits({r["node__cluster"]: r["n"] for r in rows.order_by()})


def read_free_to_take(request: PoolRequest) -> FreeUnits:
    """read_free() as approval's choice of cluster reads it: for MIG and (not one-node) whole GPUs, each cluster
    counted up to max(count, picking.COUNT_CAP) free units (capacity.picking.capped_by_cluster), not every
    free unit of the fleet. choose_clusters() then picks the best fit among the clusters with fewer than the
    cap, else the lowest id of those at the cap; spanning (under `count` each) sees exact counts."""
    if request.spec_kind != SpecKind.MIG and (request.spec_kind != SpecKind.FULL or topology.one_node(request)):
        return read_free(request)
    busy = WorkloadProfile.objects.running().multi_device_uuids()
    cap = max(request.count, picking.COUNT_CAP)
    if request.spec_kind == SpecKind.MIG:
        counts = picking.capped_by_cluster(
            mig_candidates(request, busy), "gpu__node__cluster_id", cap, request.cluster_id
        )
    else:
        counts = picking.capped_by_cluster(full_candidates(request, busy), "node__cluster_id", cap, request.cluster_id)
    return FreeUnits(counts, busy)


def choose_clusters(free: dict[int, int], need: int) -> list[int]:
    """Clusters able to hold the whole request, best fit first (the fewest spare units, then id).

    Best fit keeps the large free blocks of other clusters for large requests.
    """
    return sorted((c for c, n in free.items() if n >= need), key=lambda c: (free[c], c))


def may_span(request: PoolRequest) -> bool:
    """May approval take the request's units on several clusters? Only when the request allows it, names
    no cluster, and needs no single node (multi-GPU whole-GPU work stays on one node: topology)."""
    return request.allow_multi_cluster and not request.cluster_id and not topology.one_node(request)


def _by_binding(free: dict[int, int]) -> dict[str, list[int]]:
    """The clusters of `free`, grouped by binding, the largest free first. A pool spans clusters of one
    binding only: its pods get units by claim template under DRA and by count under the device plugin,
    and one pool's pods are written one way. A cluster with none free (approval's count after others took
    its units) comes last in its group: it adds nothing to what the group covers."""
    bindings = dict(Cluster.objects.filter(pk__in=list(free)).values_list("pk", "binding"))
    groups: dict[str, list[int]] = defaultdict(list)
    for cluster_id in sorted(bindings, key=lambda c: (-free[c], c)):
        groups[bindings[cluster_id]].append(cluster_id)
    return groups


def spread_clusters(free: dict[int, int], need: int) -> list[int]:
    """The clusters to take `need` units across when no one cluster has them all, in the order to take
    from: the largest free first (which takes the fewest clusters), within the binding whose clusters
    reach `need` with the fewest. [] when no binding's clusters have enough together."""
    best: tuple[int, list[int]] | None = None  # (index of the last cluster taken from, the binding's order)
    for order in _by_binding(free).values():
        covered = 0
        for last, cluster_id in enumerate(order):
            covered += free[cluster_id]
            if covered >= need:
                if best is None or last < best[0]:
                    best = (last, order)
                break
    return [] if best is None else best[1]


def usable_free(request: PoolRequest, free: dict[int, int]) -> int:
    """Free units one approval of `request` could take now: the most on one cluster, or, when it may span
    clusters (may_span), the most over the clusters of one binding (the queue's fit test, the forecast)."""
    single = max(free.values(), default=0)
    if not may_span(request):
        return single
    return max([single, *(sum(free[c] for c in order) for order in _by_binding(free).values())])
