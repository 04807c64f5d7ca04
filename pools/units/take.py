"""How approval takes free units (take_units), inside the approval's transaction.

On PostgreSQL the candidate rows (MigInstance or GpuCapacity) are locked with SELECT ... FOR UPDATE
SKIP LOCKED, in one order, so concurrent approvals step around each other's units without waiting (no
deadlock is possible: nobody waits). After locking, allocations are read again in a fresh statement:
under READ COMMITTED the locking query's own snapshot may predate an approval that committed just
before the lock was granted. On SQLite the IMMEDIATE transaction serialises writers. The partial unique
constraints on Allocation remain the last line of defence. A request that may span clusters (may_span)
first locks the Cluster rows it may draw from (lock_clusters, blocking, in primary-key order), so such
approvals take turns instead of each skipping the units the other locked.
"""

from __future__ import annotations

from collections import defaultdict

from django.db import connection
from django.db.models import Exists, OuterRef

from capacity import picking
from capacity.choices import SpecKind
from capacity.mig.catalog import find_product
from capacity.models import Cluster, GpuCapacity

from ..models import Allocation, PoolRequest
from . import topology
from .free import (
    FULL_RESOURCE,
    TIMESLICE_RESOURCE,
    FreeUnits,
    Unit,
    full_candidates,
    mig_candidates,
    read_free,
    request_vgpu,
    timeslice_candidates,
    vgpu_candidates,
)


def lock_clusters(cluster_ids) -> None:
    """Row-lock these clusters, waiting for them, in primary-key order (so no deadlock): approvals that may
    span clusters take turns on the clusters they draw from. Without it two such approvals each lock part
    of the other's units (SKIP LOCKED), and both fail where one would have succeeded."""
    locked = Cluster.objects.select_for_update().filter(pk__in=list(cluster_ids)).order_by("pk")
    list(locked.values_list("pk"))


def _lock(queryset):
    if connection.features.has_select_for_update_skip_locked:
        return queryset.select_for_update(skip_locked=True, of=("self",))
    return queryset


def _dedicated_first(
    queryset,
    request: PoolRequest,
    *,
    node: str,
    gpu: str,
    then: tuple[str, ...],
    away_from: frozenset[int] = frozenset(),
):
    """Order candidates so a pool gets whole nodes and whole GPUs where the demand allows: first units on
    nodes no other project holds anything on, then on GPUs no other project holds anything on, then `then`.

    Under the device plugin, binding is by count: only a node (or GPU) held by one project can be made
    exclusive (provisioning's dedicated taint); a shared one only says so ("shared node").
    `away_from` (a move off these node ids, operations/maintenance): those nodes are left out, and nodes
    the project already holds units on come first.
    """
    others = Allocation.objects.active().exclude(project_id=request.project_id).order_by()
    order = ["_node_shared", "_gpu_shared", *then]
    if away_from:
        own = Allocation.objects.active().filter(project_id=request.project_id).order_by()
        queryset = queryset.exclude(**{f"{node}__in": sorted(away_from)}).annotate(
            _own_node=Exists(own.filter(gpu__node=OuterRef(node)))
        )
        order.insert(0, "-_own_node")
    return queryset.annotate(
        _node_shared=Exists(others.filter(gpu__node=OuterRef(node))),
        _gpu_shared=Exists(others.filter(gpu=OuterRef(gpu))),
    ).order_by(*order)


def take_units(
    request: PoolRequest,
    cluster_id: int,
    need: int,
    free: FreeUnits | None = None,
    *,
    away_from: frozenset[int] = frozenset(),
) -> list[Unit]:
    """Lock and return up to `need` free units of one cluster (fewer if others hold the rest).

    Call inside the approval's transaction; see the module docstring for the locking contract.
    Units are taken on nodes and GPUs no other project uses first (_dedicated_first), then in (node,
    GPU, placement) order, so a pool packs onto few GPUs and nodes. `free`: the approval's read_free(), when
    it has one (the node and set are chosen from it, and the busy devices are not read again).
    `away_from`: node ids a reservation moves off (services.move_allocation): never taken from, and the
    project's own other nodes first.
    """
    take = {SpecKind.MIG: _take_mig, SpecKind.FULL: _take_full, SpecKind.VGPU: _take_vgpu}.get(request.spec_kind)
    return (take or _take_timeslice)(request, cluster_id, need, free, away_from)  # time-slice and MPS replicas


def _take_mig(
    request: PoolRequest, cluster_id: int, need: int, free: FreeUnits | None, away_from: frozenset[int] = frozenset()
) -> list[Unit]:
    base = mig_candidates(request, free and free.busy_devices).filter(gpu__node__cluster_id=cluster_id)
    taken: list[Unit] = []
    seen: list[int] = []
    while short := need - len(taken):  # units still to take (some locked ones were held meanwhile)
        locked = _lock(base.exclude(pk__in=seen)).select_related("profile", "gpu__node")
        if away_from:
            order = ("gpu__node_id", "gpu_id", "placement_start")
            ranked = _dedicated_first(locked, request, node="gpu__node", gpu="gpu", then=order, away_from=away_from)
            batch = list(ranked[:short])
        else:  # the same order, ranked per GPU (capacity.picking): not every free unit of the cluster
            batch = picking.pick_mig_dedicated_first(locked, request.project_id, cluster_id, short)
        if not batch:  # none left to lock
            return taken
        ids = [i.pk for i in batch]
        seen.extend(ids)
        held = set(
            Allocation.objects.holding().filter(mig_instance_id__in=ids).values_list("mig_instance_id", flat=True)
        )
        for instance in batch:
            if instance.pk in held:
                continue
            taken.append(
                Unit(
                    gpu_id=instance.gpu_id,
                    mig_instance_id=instance.pk,
                    replica=0,
                    resource_name=instance.profile.resource_name,
                    product=instance.profile.product,
                    profile_name=instance.profile.name,
                    compute_slices=instance.profile.compute_slices,
                    node_name=instance.gpu.node.name,
                    cluster_id=cluster_id,
                )
            )
    return taken


def _gpu_product(gpu: GpuCapacity) -> str:
    return (gpu.catalog_product or gpu.product)[:32]


def _full_slices(gpu: GpuCapacity) -> int:
    product = find_product(gpu.catalog_product or gpu.product)
    return product.compute_slices if product else 7


def _gpu_batch(
    base, seen: list[int], request: PoolRequest, limit: int, away_from: frozenset[int] = frozenset()
) -> list[GpuCapacity]:
    """The next `limit` candidate GPUs not seen yet, locked, whole nodes and GPUs first (_dedicated_first)."""
    locked = _lock(base.exclude(pk__in=seen)).select_related("node")
    ordered = _dedicated_first(locked, request, node="node", gpu="pk", then=("node_id", "index"), away_from=away_from)
    return list(ordered[:limit])


def _take_full(
    request: PoolRequest, cluster_id: int, need: int, free: FreeUnits | None, away_from: frozenset[int] = frozenset()
) -> list[Unit]:
    if free is None:
        free = read_free(request)
    base = full_candidates(request, free.busy_devices).filter(node__cluster_id=cluster_id)
    if away_from:  # a move takes one unit at a time: the pool's one-node set is not chosen again
        return _take_full_from(request, base, cluster_id, need, away_from)
    if topology.one_node(request):
        gpus = free.gpus  # read_free() reads them for multi-GPU whole-GPU work
        nodes = topology.nodes_that_fit(topology.by_node(gpus), cluster_id, need)
        sets = topology.sets_on_nodes(gpus, nodes, need)
        for node_id in sorted(nodes, key=lambda n: sets[n][0]):  # nearest set first, then best fit
            on_node = base.filter(node_id=node_id)
            for within in (on_node.filter(pk__in=sets[node_id][1]), on_node):  # its nearest set, else any GPUs
                taken = _take_full_from(request, within, cluster_id, need)
                if not need - len(taken):  # all of them, on this node
                    return taken
        return []
    return _take_full_from(request, base, cluster_id, need)


def _take_full_from(
    request: PoolRequest, base, cluster_id: int, need: int, away_from: frozenset[int] = frozenset()
) -> list[Unit]:
    taken: list[Unit] = []
    seen: list[int] = []
    while short := need - len(taken):
        batch = _gpu_batch(base, seen, request, short, away_from)
        if not batch:  # none left to lock
            return taken
        ids = [g.pk for g in batch]
        seen.extend(ids)
        held = set(Allocation.objects.holding().filter(gpu_id__in=ids).values_list("gpu_id", flat=True))
        taken.extend(
            Unit(
                g.pk,
                None,
                0,
                FULL_RESOURCE,
                _gpu_product(g),
                "",
                _full_slices(g),
                g.node.name,
                cluster_id,
                tuple(getattr(g, group) for group in topology.LOCALITY),
            )
            for g in batch
            if g.pk not in held
        )
    return taken


def localities(request: PoolRequest, taken: list[Unit]) -> list[tuple]:
    """The groups (topology.LOCALITY) of each GPU taken for multi-GPU whole-GPU work, for topology.placement;
    [] otherwise. Read with the units when they were locked (Unit.locality): no query."""
    if not topology.one_node(request):
        return []
    return [u.locality for u in taken]


def _take_timeslice(
    request: PoolRequest, cluster_id: int, need: int, free: FreeUnits | None, away_from: frozenset[int]
) -> list[Unit]:
    base = timeslice_candidates(request).filter(node__cluster_id=cluster_id)
    return _take_shares(
        request, base, cluster_id, need, lambda gpu: (gpu.node.timeslice_replicas, TIMESLICE_RESOURCE, ""), away_from
    )


def _take_vgpu(
    request: PoolRequest, cluster_id: int, need: int, free: FreeUnits | None, away_from: frozenset[int]
) -> list[Unit]:
    vgpu = request_vgpu(request)
    base = vgpu_candidates(request).filter(node__cluster_id=cluster_id)
    return _take_shares(
        request, base, cluster_id, need, lambda gpu: (vgpu.max_per_gpu, vgpu.resource_name, vgpu.name), away_from
    )


def _take_shares(
    request: PoolRequest, base, cluster_id: int, need: int, shares, away_from: frozenset[int] = frozenset()
) -> list[Unit]:
    """Up to `need` (GPU, index) shares not held: time-slice replicas or vGPUs. `shares(gpu)` gives
    (shares per GPU, extended resource, profile name recorded)."""
    taken: list[Unit] = []
    seen: list[int] = []
    while short := need - len(taken):
        batch = _gpu_batch(base, seen, request, short, away_from)  # each has a share free, unless held meanwhile
        if not batch:  # none left to lock
            return taken
        ids = [g.pk for g in batch]
        seen.extend(ids)
        held: dict[int, set[int]] = defaultdict(set)
        rows = Allocation.objects.holding().filter(gpu_id__in=ids, mig_instance__isnull=True)
        for gpu_id, replica in rows.values_list("gpu_id", "replica"):
            held[gpu_id].add(replica)
        unheld = [(gpu, replica) for gpu in batch for replica in range(shares(gpu)[0]) if replica not in held[gpu.pk]]
        for gpu, replica in unheld[:short]:
            replicas, resource_name, profile_name = shares(gpu)
            weight = max(1, round(_full_slices(gpu) / replicas))
            product = _gpu_product(gpu)
            taken.append(
                Unit(gpu.pk, None, replica, resource_name, product, profile_name, weight, gpu.node.name, cluster_id)
            )
    return taken


# --- Availability for the request at hand -------------------------------------------------------
