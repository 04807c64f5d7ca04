"""Free units and how approval takes them: MIG instances, full GPUs, time-slice replicas and vGPUs.

A unit is a candidate when it is free (MigInstance.objects.free(), GpuCapacity.objects.free() and
.with_free_replicas(): the one definition of availability, capacity.choices.Availability) and
matches the request (kind, product, profile, tier, cluster).

Taking units (take_units) must run inside the approval's transaction. On PostgreSQL the candidate
rows (MigInstance or GpuCapacity) are locked with SELECT ... FOR UPDATE SKIP LOCKED, in one order,
so concurrent approvals step around each other's units without waiting (no deadlock is possible:
nobody waits). After locking, allocations are read again in a fresh statement: under READ COMMITTED
the locking query's own snapshot may predate an approval that committed just before the lock was
granted. On SQLite the IMMEDIATE transaction serialises writers. The partial unique constraints on
Allocation remain the last line of defence. A request that may span clusters (may_span) first locks
the Cluster rows it may draw from (lock_clusters, blocking, in primary-key order), so such approvals
take turns instead of each skipping the units the other locked.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, Sum

from capacity import picking, tiers
from capacity.choices import Availability, SpecKind, Tier
from capacity.mig.catalog import PRODUCTS, find_product
from capacity.mig.planner import GpuState, plan_onto_gpus
from capacity.models import Cluster, GpuCapacity, MigInstance, WorkloadProfile
from capacity.vgpu import VGPU_TYPES, VgpuType

from . import topology
from .models import Allocation, PoolRequest

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
    the node and the set from one read (then locks, pools/units.py). `busy_devices`: the devices of pods
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
    """Clusters with free units, grouped by binding, the largest free first. A pool spans clusters of one
    binding only: its pods get units by claim template under DRA and by count under the device plugin,
    and one pool's pods are written one way."""
    bindings = dict(Cluster.objects.filter(pk__in=[c for c, n in free.items() if n > 0]).values_list("pk", "binding"))
    groups: dict[str, list[int]] = defaultdict(list)
    for cluster_id in sorted(bindings, key=lambda c: (-free[c], c)):
        groups[bindings[cluster_id]].append(cluster_id)
    return groups


def spread_clusters(free: dict[int, int], need: int) -> list[int]:
    """The clusters to take `need` units across when no one cluster has them all, in the order to take
    from: the largest free first (which takes the fewest clusters), within the binding whose clusters
    reach `need` with the fewest. [] when no binding's clusters have enough together."""
    best: tuple[int, list[int]] | None = None
    for order in _by_binding(free).values():
        covered = 0
        for used, cluster_id in enumerate(order, start=1):
            covered += free[cluster_id]
            if covered >= need:
                if best is None or used < best[0]:
                    best = (used, order)
                break
    return [] if best is None else best[1]


def usable_free(request: PoolRequest, free: dict[int, int]) -> int:
    """Free units one approval of `request` could take now: the most on one cluster, or, when it may span
    clusters (may_span), the most over the clusters of one binding (the queue's fit test, the forecast)."""
    single = max(free.values(), default=0)
    if not may_span(request):
        return single
    return max([single, *(sum(free[c] for c in order) for order in _by_binding(free).values())])


def lock_clusters(cluster_ids) -> None:
    """Row-lock these clusters, waiting for them, in primary-key order (so no deadlock): approvals that may
    span clusters take turns on the clusters they draw from. Without it two such approvals each lock part
    of the other's units (SKIP LOCKED), and both fail where one would have succeeded."""
    locked = Cluster.objects.select_for_update().filter(pk__in=list(cluster_ids)).order_by("pk")
    list(locked.values_list("pk", flat=True))


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
    if request.spec_kind == SpecKind.MIG:
        return _take_mig(request, cluster_id, need, free, away_from)
    if request.spec_kind == SpecKind.FULL:
        return _take_full(request, cluster_id, need, free, away_from)
    if request.spec_kind == SpecKind.VGPU:
        return _take_vgpu(request, cluster_id, need, away_from)
    return _take_timeslice(request, cluster_id, need, away_from)


def _take_mig(
    request: PoolRequest, cluster_id: int, need: int, free: FreeUnits | None, away_from: frozenset[int] = frozenset()
) -> list[Unit]:
    base = mig_candidates(request, free and free.busy_devices).filter(gpu__node__cluster_id=cluster_id)
    taken: list[Unit] = []
    seen: list[int] = []
    while len(taken) < need:
        rest = base.exclude(pk__in=seen)
        locked = _lock(rest).select_related("profile", "gpu__node")
        if away_from:
            order = ("gpu__node_id", "gpu_id", "placement_start")
            ranked = _dedicated_first(locked, request, node="gpu__node", gpu="gpu", then=order, away_from=away_from)
            batch = list(ranked[: need - len(taken)])
        else:  # the same order, ranked per GPU (capacity.picking): not every free unit of the cluster
            batch = picking.pick_mig_dedicated_first(locked, request.project_id, cluster_id, need - len(taken))
        if not batch:
            break
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
        gpus = free.gpus if free.gpus is not None else topology.free_gpus(base)
        nodes = topology.nodes_that_fit(topology.by_node(gpus), cluster_id, need)
        sets = topology.sets_on_nodes(gpus, nodes, need)
        for node_id in sorted(nodes, key=lambda n: sets[n][0]):  # nearest set first, then best fit
            on_node = base.filter(node_id=node_id)
            if sets[node_id][1]:
                taken = _take_full_from(request, on_node.filter(pk__in=sets[node_id][1]), cluster_id, need)
                if len(taken) == need:
                    return taken
            taken = _take_full_from(request, on_node, cluster_id, need)
            if len(taken) == need:
                return taken
        return []
    return _take_full_from(request, base, cluster_id, need)


def _take_full_from(
    request: PoolRequest, base, cluster_id: int, need: int, away_from: frozenset[int] = frozenset()
) -> list[Unit]:
    taken: list[Unit] = []
    seen: list[int] = []
    while len(taken) < need:
        batch = _gpu_batch(base, seen, request, need - len(taken), away_from)
        if not batch:
            break
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


def _take_timeslice(request: PoolRequest, cluster_id: int, need: int, away_from: frozenset[int]) -> list[Unit]:
    base = timeslice_candidates(request).filter(node__cluster_id=cluster_id)
    return _take_shares(
        request, base, cluster_id, need, lambda gpu: (gpu.node.timeslice_replicas, TIMESLICE_RESOURCE, ""), away_from
    )


def _take_vgpu(request: PoolRequest, cluster_id: int, need: int, away_from: frozenset[int]) -> list[Unit]:
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
    while len(taken) < need:
        batch = _gpu_batch(base, seen, request, need, away_from)
        if not batch:
            break
        ids = [g.pk for g in batch]
        seen.extend(ids)
        held: dict[int, set[int]] = defaultdict(set)
        rows = Allocation.objects.holding().filter(gpu_id__in=ids, mig_instance__isnull=True)
        for gpu_id, replica in rows.values_list("gpu_id", "replica"):
            held[gpu_id].add(replica)
        for gpu in batch:
            replicas, resource_name, profile_name = shares(gpu)
            weight = max(1, round(_full_slices(gpu) / replicas))
            for replica in range(replicas):
                if len(taken) == need:
                    break
                if replica not in held[gpu.pk]:
                    taken.append(
                        Unit(
                            gpu.pk,
                            None,
                            replica,
                            resource_name,
                            _gpu_product(gpu),
                            profile_name,
                            weight,
                            gpu.node.name,
                            cluster_id,
                        )
                    )
    return taken


# --- Availability for the request at hand -------------------------------------------------------
# The one answer every screen gives about a request's units: free now (what approval would take),
# withheld by the tier policy (Availability.TIER_POLICY, named with the tier's rule), and whether any
# unit of the fleet could ever serve it under the current policy. The form's check, the API's dry run,
# the forecast, approval's refusal and the submit-time refusal all read it here.


@dataclass(frozen=True)
class Verdict:
    """What approval would do with a request's units now, and why not where it would not."""

    spec: str  # unit_label(): "H100-80GB 1g.10gb"
    need: int
    free_by_cluster: dict[int, int]
    free: int  # usable_free(): what one approval could take now
    withheld: int  # units of the spec on the request's tiers that the tier policy withholds
    reason: (
        str  # withheld_label() of the tier that withholds them: "Withheld by tier policy (tier 1 takes 3g and larger)"
    )
    refusal: str = ""  # why no unit would ever serve it, with the nearest offer that would: "" when one could

    @property
    def fits(self) -> bool:
        return self.free >= self.need

    @property
    def servable(self) -> bool:
        return not self.refusal

    def withheld_sentence(self) -> str:
        """ "31 x H100-80GB 1g.10gb withheld by tier policy (tier 1 takes 3g and larger)", or "" when none are."""
        if not self.withheld:
            return ""
        return f"{self.withheld} x {self.spec} {self.reason[0].lower()}{self.reason[1:]}"


def verdict(request: PoolRequest, free: FreeUnits | None = None) -> Verdict:
    """The request's Verdict: read_free() (unless given as `free`) and, for MIG, the units the tier policy
    withholds and whether any GPU of the request's tiers may ever carry its profile (never_served())."""
    read = free if free is not None else read_free(request)
    usable = usable_free(request, read.by_cluster)
    if request.spec_kind != SpecKind.MIG:
        return Verdict(unit_label(request), request.count, read.by_cluster, usable, 0, "")
    table = tiers.policies()
    withheld = _withheld_tiers(request, read.busy_devices)
    refused = never_served(request, table)
    if withheld:
        reason = tiers.withheld_label(withheld[0][0], table)
    else:
        reason = tiers.withheld_label(refused[0], table) if refused else ""
    return Verdict(
        unit_label(request),
        request.count,
        read.by_cluster,
        usable,
        sum(n for _, n in withheld),
        reason,
        _refusal(refused, table),
    )


def refusal(request: PoolRequest) -> str:
    """Why no unit would ever serve `request` under the tier policy, with the nearest offer that would:
    "Withheld by tier policy (tier 1 takes 3g and larger); 4 x 3g.40gb would be served" (the words every screen
    uses for a withheld unit); "" when a unit could (never_served())."""
    table = tiers.policies()
    return _refusal(never_served(request, table), table)


def _refusal(refused: tuple[str, str] | None, table: dict) -> str:
    if refused is None:
        return ""
    tier, nearest = refused
    return tiers.withheld_label(tier, table) + (f"; {nearest}" if nearest else "")


def never_served(request: PoolRequest, table: dict | None = None) -> tuple[str, str] | None:
    """(tier, nearest offer) when the tier policy keeps the request's MIG profile off every GPU that could
    carry it (present MIG GPUs of its product, tiers and cluster), so no unit would ever serve it; None when
    one could, or when no such GPU exists at all (that is not the policy's doing). Two queries."""
    if request.spec_kind != SpecKind.MIG:
        return None
    table = table if table is not None else tiers.policies()
    hosts = _mig_hosts(request)
    host_tiers = sorted(set(hosts.order_by().values_list("node__tier", flat=True).distinct()))
    allowed = tiers.tiers_allowing(request.product, request.profile_name, table)
    if not host_tiers or any(t in allowed for t in host_tiers):
        return None
    return host_tiers[0], _nearest(request, host_tiers[0], hosts, table)


def _withheld_tiers(request: PoolRequest, busy_devices: frozenset[str] | None) -> list[tuple[str, int]]:
    """(node tier, units) of the request's spec that the tier policy withholds, the most first."""
    queryset = MigInstance.objects.annotate_availability(busy_devices).filter(
        _tier_q(request, (), "gpu__"), profile__name=request.profile_name, availability=Availability.TIER_POLICY
    )
    if request.product:
        queryset = queryset.filter(profile__product=request.product)
    if request.cluster_id:
        queryset = queryset.filter(gpu__node__cluster_id=request.cluster_id)
    rows = queryset.values("gpu__node__tier").annotate(n=Count("pk")).order_by()
    return sorted(((r["gpu__node__tier"], r["n"]) for r in rows), key=lambda tn: (-tn[1], tn[0]))


def _mig_hosts(request: PoolRequest, gpus=None):
    """MIG GPUs (of `gpus`, default present ones) of the request's product, tiers and cluster: where its
    profile could live, whatever the tier policy says."""
    gpus = (GpuCapacity.objects.present() if gpus is None else gpus).filter(_tier_q(request, ()), mig_mode_current=True)
    if request.product:
        gpus = gpus.filter(catalog_product=request.product)
    else:
        gpus = gpus.filter(catalog_product__in=_products_with_profile(request.profile_name))
    if request.cluster_id:
        gpus = gpus.filter(node__cluster_id=request.cluster_id)
    return gpus


def _nearest(request: PoolRequest, tier: str, hosts, table) -> str:
    """The profile closest to the request's that `tier` admits on the hosts' product, the next larger first:
    "4 x 3g.40gb would be served"; "" when the tier admits none."""
    product = find_product(request.product or (hosts.values_list("catalog_product", flat=True).first() or ""))
    wanted = product.by_name.get(request.profile_name) if product else None
    if product is None or wanted is None:
        return ""
    admitted = [
        p
        for p in product.profiles
        if not p.has_media_extensions and tiers.profile_allowed(tier, product.key, p.name, table)
    ]
    if not admitted:
        return ""
    best = min(
        admitted,
        key=lambda p: (
            p.compute_slices < wanted.compute_slices,
            abs(p.compute_slices - wanted.compute_slices),
            p.memory_slices,
        ),
    )
    return f"{request.count} x {best.name} would be served"


# --- Explaining a shortage ----------------------------------------------------------------------


def shortage(request: PoolRequest, free: dict[int, int]) -> tuple[str, dict]:
    """What is missing, as a sentence and as data: "need 4 x H100-80GB 3g.40gb, 1 free", the units the
    tier policy withholds and whether the request can ever be served (verdict()), plus, for MIG, whether
    reconfiguring idle MIG GPUs (capacity.mig.planner.plan_onto_gpus) would make room."""
    names = dict(Cluster.objects.filter(pk__in=free).values_list("pk", "name"))
    best = max(free, key=lambda c: (free[c], -c)) if free else None
    best_free = free.get(best, 0) if best is not None else 0
    total = sum(free.values())
    what = f"{request.count} x {unit_label(request)}"
    if topology.one_node(request):
        where = f" on {names[best]}" if best is not None else ""
        message = f"need {what} on one node, at most {best_free} free on one node{where}"
    elif may_span(request) and len(free) > 1:
        usable = usable_free(request, free)
        where = "in all" if usable == total else f"on clusters of one binding, {total} in all"
        message = f"need {what} across clusters, {usable} free {where}"
    elif len(free) > 1:
        message = f"need {what} on one cluster, at most {best_free} free on one ({names[best]}), {total} free in all"
    else:
        message = f"need {what}, {best_free} free"
    found = verdict(request, FreeUnits(free))
    if found.withheld:
        message += f"; {found.withheld_sentence()}"
    if not found.servable:
        message += f"; it can never be served: {found.refusal}"
    detail: dict = {
        "need": request.count,
        "spec": unit_label(request),
        "free": best_free,
        "free_by_cluster": {names[c]: n for c, n in sorted(free.items(), key=lambda kv: names[kv[0]])},
        "withheld": {"units": found.withheld, "reason": found.reason},
        "servable": found.servable,
        "refusal": found.refusal,
        "reconfiguration": None,
    }
    if topology.one_node(request):
        fit = topology.what_would_fit(request, full_candidates(request), full_hosts(request))
        detail["one_node"] = fit
        if fit["node"] is None:
            message += f"; no node has {request.count} such GPUs (the largest has {fit['largest']})"
        else:
            message += f"; {fit['node']} would hold it once {fit['to_release']} of its {fit['gpus']} GPUs are released"
    if request.spec_kind == SpecKind.MIG:
        hint = reconfiguration_hint(request, free)
        detail["reconfiguration"] = hint
        if hint is None:
            message += "; no MIG reconfiguration of idle GPUs would make room"
        else:
            gpus = ", ".join(hint["gpus"])
            message += (
                f"; reconfiguring GPUs {gpus} on {hint['cluster']} would free {hint['would_free']}"
                f" more ({hint['available_after']} available)"
            )
    return message, detail


def unit_label(request: PoolRequest) -> str:
    product = request.product or "any GPU"
    if request.spec_kind == SpecKind.MIG:
        return f"{request.product} {request.profile_name}".strip()
    if request.spec_kind == SpecKind.TIMESLICE:
        return f"{product} time-slice replica"
    if request.spec_kind == SpecKind.MPS:
        return f"{product} MPS replica"
    if request.spec_kind == SpecKind.VGPU:
        return f"vGPU {request.profile_name} ({product})"
    return f"{product} full GPU"


def reconfiguration_hint(request: PoolRequest, free: dict[int, int]) -> dict | None:
    """The best single-cluster MIG reconfiguration that would meet the request, or the one that gets closest.

    Allocated instances and instances with running workloads stay where they are; only the layout
    of the remaining slices may change. Returns None when no reconfiguration adds a unit.
    """
    gpus = _mig_hosts(request, GpuCapacity.objects.usable())
    gpus = gpus.filter(node__tier__in=tiers.tiers_allowing(request.product, request.profile_name))
    rows = list(gpus.select_related("node__cluster").order_by("node__cluster_id", "node_id", "index"))
    if not rows:
        return None
    instances: dict[int, list[tuple[str, int]]] = defaultdict(list)
    pinned: dict[int, set[int]] = defaultdict(set)
    instances_of_rows = MigInstance.objects.annotate_availability().filter(gpu__in=[g.pk for g in rows])
    for gpu_id, name, start, availability in instances_of_rows.values_list(
        "gpu_id", "profile__name", "placement_start", "availability"
    ):
        instances[gpu_id].append((name, start))
        if availability in (Availability.RESERVED, Availability.IN_USE, Availability.ENDING):
            pinned[gpu_id].add(start)
    groups: dict[tuple[int, str], list[GpuCapacity]] = defaultdict(list)
    for gpu in rows:
        groups[(gpu.node.cluster_id, gpu.catalog_product)].append(gpu)
    best = None
    for (cluster_id, product), members in groups.items():
        states = [GpuState(g.uuid, tuple(instances[g.pk]), frozenset(pinned[g.pk])) for g in members]
        try:
            plan = plan_onto_gpus(product, states, {request.profile_name: request.count})
        except (ValueError, KeyError):  # an inventory the catalog cannot place: no advice from it
            continue
        met = sum(plan.met.values())
        now = free.get(cluster_id, 0)
        if met <= now:
            continue
        touched = [c.gpu for c in plan.changes if c.touched]
        key = (met >= request.count, met, -len(touched))
        if best is None or key > best[0]:
            best = (
                key,
                {
                    "cluster": members[0].node.cluster.name,
                    "product": product,
                    "gpus": touched,
                    "would_free": met - now,
                    "available_after": met,
                    "meets_request": met >= request.count,
                },
            )
    return None if best is None else best[1]


def _products_with_profile(profile_name: str) -> list[str]:
    return [key for key, product in PRODUCTS.items() if profile_name in product.by_name]
