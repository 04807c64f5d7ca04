"""Maintenance: "can these GPUs or nodes go down?" for a driver or firmware update.

take_offline_check() answers whether the remaining capacity still covers every active allocation
if the given GPUs (and every GPU of the given nodes) go offline, and lists what would be hit: each
allocation on those units, and whether it could move to a free equivalent unit elsewhere in the
same cluster (same product and MIG profile, a whole GPU of the same product, or a free time-slice
replica of the same product) not going down. Free means what approval means (MigInstance.objects.free(),
GpuCapacity.objects.free() and .with_free_replicas()).

Read-only: nothing is locked or written. Matching is by counts per equivalent unit (every unit of
one kind serves any allocation of that kind), so the answer is exact for "could all move".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.db.models import Q

from capacity.choices import SharingStrategy, SpecKind
from capacity.models import GpuCapacity, MigInstance, WorkloadProfile
from pools.models import Allocation


@dataclass
class HitAllocation:
    allocation: Allocation
    unit: str  # "H100-80GB 3g.40gb", "H100-80GB full GPU", "H100-80GB time-slice"
    movable: bool

    def to_dict(self) -> dict:
        a = self.allocation
        return {
            "allocation": a.pk,
            "project": a.project.slug,
            "pool": a.pool_id,
            "node": a.gpu.node.name,
            "gpu": a.gpu.index,
            "unit": self.unit,
            "movable": self.movable,
        }


@dataclass
class OfflineCheck:
    gpus: list  # GpuCapacity rows going down
    hit: list[HitAllocation] = field(default_factory=list)
    free_elsewhere: dict[str, int] = field(default_factory=dict)
    shortfall: dict[str, int] = field(default_factory=dict)

    @property
    def covered(self) -> bool:
        """Every allocation on the units going down can move to a free equivalent unit elsewhere."""
        return all(h.movable for h in self.hit)

    def to_dict(self) -> dict:
        return {
            "covered": self.covered,
            "gpus": [{"node": g.node.name, "index": g.index, "uuid": g.uuid} for g in self.gpus],
            "hit": [h.to_dict() for h in self.hit],
            "free_elsewhere": dict(self.free_elsewhere),
            "shortfall": dict(self.shortfall),
        }


def _product(gpu: GpuCapacity) -> str:
    return gpu.catalog_product or gpu.product


def _unit_key(cluster_id: int, kind: str, product: str, profile: str = "") -> tuple:
    return (cluster_id, kind, product, profile)


def _label(key: tuple) -> str:
    _, kind, product, profile = key
    if kind == SpecKind.MIG:
        return f"{product} {profile}"
    if kind == SpecKind.TIMESLICE:
        return f"{product} time-slice"
    if kind == SpecKind.MPS:
        return f"{product} MPS replica"
    return f"{product} full GPU"


def take_offline_check(*, gpus=(), nodes=()) -> OfflineCheck:
    """What going offline would hit (see module docstring). `gpus`/`nodes`: rows or primary keys."""
    gpu_ids = {getattr(g, "pk", g) for g in gpus}
    node_ids = {getattr(n, "pk", n) for n in nodes}
    down = list(
        GpuCapacity.objects.present()
        .filter(Q(pk__in=gpu_ids) | Q(node_id__in=node_ids))
        .select_related("node__cluster")
        .order_by("node__cluster_id", "node__name", "index")
    )
    down_ids = {g.pk for g in down}
    check = OfflineCheck(gpus=down)
    allocations = list(
        Allocation.objects.active()
        .filter(gpu_id__in=down_ids)
        .select_related("project", "gpu__node", "mig_instance__profile")
        .order_by("gpu__node__name", "gpu__index", "id")
    )
    if not allocations:
        return check
    clusters = {g.node.cluster_id for g in down}
    free = _free_units(clusters, down_ids)
    check.free_elsewhere = {_label(k): v for k, v in sorted(free.items()) if v}
    remaining = Counter(free)
    needed: Counter = Counter()
    for allocation in allocations:
        key = _allocation_key(allocation)
        needed[key] += 1
        movable = remaining[key] > 0
        if movable:
            remaining[key] -= 1
        check.hit.append(HitAllocation(allocation, _label(key), movable))
    check.shortfall = {_label(k): n - free.get(k, 0) for k, n in sorted(needed.items()) if n > free.get(k, 0)}
    return check


def _allocation_key(allocation) -> tuple:
    cluster_id = allocation.gpu.node.cluster_id
    product = allocation.product or _product(allocation.gpu)
    if allocation.kind == SpecKind.MIG:
        profile = allocation.profile_name or allocation.mig_instance.profile.name
        return _unit_key(cluster_id, SpecKind.MIG, product, profile)
    return _unit_key(cluster_id, allocation.kind, product)


def _free_units(cluster_ids: set[int], excluded_gpu_ids: set[int]) -> Counter:
    """Free units by key (the approval's definition: .free(), .with_free_replicas()) outside `excluded_gpu_ids`."""
    busy = WorkloadProfile.objects.running().multi_device_uuids()
    free: Counter = Counter()
    instances = (
        MigInstance.objects.free(busy)
        .filter(gpu__node__cluster_id__in=cluster_ids)
        .exclude(gpu_id__in=excluded_gpu_ids)
        .values_list("gpu__node__cluster_id", "profile__product", "profile__name")
    )
    for cluster_id, product, profile in instances:
        free[_unit_key(cluster_id, SpecKind.MIG, product, profile)] += 1
    whole = (
        GpuCapacity.objects.free(busy)
        .filter(node__cluster_id__in=cluster_ids, node__timeslice_replicas__lte=1)
        .exclude(pk__in=excluded_gpu_ids)
    )
    for gpu in whole.select_related("node"):
        free[_unit_key(gpu.node.cluster_id, SpecKind.FULL, _product(gpu))] += 1
    sliced = GpuCapacity.objects.with_free_replicas().filter(node__cluster_id__in=cluster_ids)
    for gpu in sliced.exclude(pk__in=excluded_gpu_ids).select_related("node"):
        kind = SpecKind.MPS if gpu.node.sharing_strategy == SharingStrategy.MPS else SpecKind.TIMESLICE
        free[_unit_key(gpu.node.cluster_id, kind, _product(gpu))] += gpu.free
    return free
