"""Capacity planning: units per tier of the live fleet, and slots of a proposed layout. Read-only.

- tier_plan(): the live plan per tier (the node's tier, `gpuaas.io/tier`): the units approval would
  hand out on each tier's nodes, counted with approval's own predicates (MigInstance.objects'
  availability, which applies the TierProfilePolicy rows; GpuCapacity.objects.whole_gpu_hosts(),
  .timeslice_hosts(), .vgpu_hosts() and .annotate_shares(), which pools/units/ draws from): MIG
  instances the tier's policy admits, whole GPUs, time-slice replicas, MPS clients and vGPUs of the
  node's configured type. Per tier: total, reserved (held by pools), free (what approval gives out now),
  unavailable, withheld by the tier policy, GPUs nothing is handed out from, and the maintenance reserve.
- current_capacity_plan(): the fleet's GPUs grouped by product and use (MIG layout, replicas, whole),
  with the seed's slot arithmetic per group; its tiers are the arithmetic's, not the nodes' (use tier_plan).
- proposed_capacity_plan(): the seed's arithmetic for a proposed layout or replica count on N GPUs.

Rebalancing, which weighs pools' demand against these GPUs, is operations.rebalancing; procurement reads
tier_plan() for the units one GPU of a product gives on a tier (SpecFigures.per_gpu).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from django.db.models import Count, Q, Subquery, Sum

from capacity import tiers as tier_policy
from capacity.choices import Availability, SpecKind, Tier
from capacity.mig import tiers
from capacity.mig.catalog import find_product
from capacity.models import GpuCapacity, MigInstance, WorkloadProfile
from capacity.models.availability import as_boolean
from capacity.models.inventory import vgpu_offers
from capacity.models.tiers import admitted_q
from capacity.vgpu import VGPU_TYPES
from policies import policy

MPS = "mps"  # SpecFigures.kind of MPS clients (time-slice replicas of MPS nodes)
TIER_ORDER = [Tier.SLA_INFERENCE, Tier.STAGING, Tier.DEVELOPMENT, Tier.TRAINING, Tier.NONE]


@dataclass
class SpecFigures:
    """Units of one kind, product and spec on one tier. `per_gpu`: the units one GPU gives (MIG: None,
    each GPU's layout decides)."""

    kind: str  # SpecKind value, or "mps"
    product: str
    spec: str  # MIG profile, vGPU type; the product for whole GPUs and replicas
    per_gpu: int | None
    gpus: int = 0  # GPUs carrying these units (MIG: GPUs with at least one)
    total: int = 0
    reserved: int = 0
    free: int = 0

    @property
    def unavailable(self) -> int:
        return self.total - self.reserved - self.free


@dataclass
class TierFigures:
    """One tier's units. total = reserved + free + unavailable; `withheld` (MIG instances the tier's policy
    refuses) and `unserved_gpus` (whole GPUs no approval hands out on this tier) are outside total."""

    tier: str
    label: str
    rule: str  # "tier 1 takes 3g and larger"
    gpus: int = 0
    total: int = 0
    reserved: int = 0
    free: int = 0
    withheld: int = 0
    unserved_gpus: int = 0
    reserve: int = 0  # units held back for maintenance (the strategy's spare GPUs)
    specs: list[SpecFigures] = field(default_factory=list)

    @property
    def unavailable(self) -> int:
        return self.total - self.reserved - self.free

    @property
    def free_after_reserve(self) -> int:
        """Free units less the maintenance reserve: what is left to promise to new work."""
        return max(0, self.free - self.reserve)


@dataclass
class TierPlan:
    tiers: list[TierFigures]
    reserve_gpus: int  # settings.CAPACITY_MAINTENANCE_RESERVE_GPUS

    def tier(self, tier: str) -> TierFigures | None:
        return next((t for t in self.tiers if t.tier == tier), None)

    def as_dict(self) -> dict:
        """JSON-able, with the computed figures (unavailable, free_after_reserve) beside the stored ones."""
        out = []
        for figures in self.tiers:
            row = asdict(figures)
            row["unavailable"] = figures.unavailable
            row["free_after_reserve"] = figures.free_after_reserve
            for spec, data in zip(figures.specs, row["specs"], strict=True):
                data["unavailable"] = spec.unavailable
            out.append(row)
        return {"reserve_gpus": self.reserve_gpus, "tiers": out}


class _Tally:
    """Figures per (cluster, tier) and spec while the queries are read, and the per-GPU units the reserve needs."""

    def __init__(self) -> None:
        self.specs: dict[tuple, SpecFigures] = {}
        self.per_gpu: dict[tuple[int, str], Counter] = defaultdict(Counter)  # (cluster, tier) -> {units: GPUs}
        self.withheld: Counter = Counter()
        self.unserved: Counter = Counter()
        self.gpus: Counter = Counter()  # present GPUs per tier

    def spec(self, tier: str, kind: str, product: str, name: str, per_gpu: int | None) -> SpecFigures:
        key = (tier, kind, product, name)
        if key not in self.specs:
            self.specs[key] = SpecFigures(kind, product, name, per_gpu)
        return self.specs[key]


def _product(catalog_product: str, product: str) -> str:
    return catalog_product or product


def tier_plan(
    *,
    cluster=None,
    reserve_gpus: int | None = None,
    busy_devices: frozenset[str] | None = None,
    table: dict | None = None,
    mig_counts: list[dict] | None = None,
) -> TierPlan:
    """The live fleet's units per tier, as approval would hand them out (optionally of one cluster).

    A fixed number of queries (nine) whatever the fleet's size; seven when the caller read the busy devices
    (WorkloadProfile.objects.running().multi_device_uuids()) and the tier policies (capacity.tiers.policies()),
    six when it also read mig_unit_counts() of the same clusters (`mig_counts`).
    The maintenance reserve of a tier is, per cluster, the units of the `reserve_gpus` GPUs of that tier that
    carry the most (default: the CAPACITY_MAINTENANCE_RESERVE_GPUS policy): approval does not enforce it; the
    plan shows what is free beyond it.
    """
    reserve_gpus = policy("CAPACITY_MAINTENANCE_RESERVE_GPUS") if reserve_gpus is None else reserve_gpus
    gpus = GpuCapacity.objects.all() if cluster is None else GpuCapacity.objects.filter(node__cluster=cluster)
    busy = WorkloadProfile.objects.running().multi_device_uuids() if busy_devices is None else busy_devices
    table = tier_policy.policies() if table is None else table
    tally = _Tally()
    _count_mig(tally, busy, cluster, table, mig_counts)
    _count_whole(tally, busy, gpus)
    _count_shares(tally, gpus)
    figures: dict[str, TierFigures] = {}

    def of(tier: str) -> TierFigures:
        if tier not in figures:
            figures[tier] = TierFigures(tier, Tier(tier).label, tier_policy.rule(tier, table))
        return figures[tier]

    for tier, n in tally.gpus.items():
        of(tier).gpus += n
    for (tier, *_), spec in sorted(tally.specs.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        row = of(tier)
        row.specs.append(spec)
        row.total += spec.total
        row.reserved += spec.reserved
        row.free += spec.free
    for tier, n in tally.withheld.items():
        of(tier).withheld += n
    for tier, n in tally.unserved.items():
        of(tier).unserved_gpus += n
    for (_cluster, tier), per_gpu in tally.per_gpu.items():
        of(tier).reserve += _largest(per_gpu, reserve_gpus)
    ordered = [figures[t] for t in TIER_ORDER if t in figures]
    return TierPlan(ordered, reserve_gpus)


def _largest(per_gpu: Counter, n: int) -> int:
    """The units of the `n` GPUs that carry the most ({units per GPU: GPUs})."""
    left, total = n, 0
    for units in sorted(per_gpu, reverse=True):
        take = min(left, per_gpu[units])
        total += take * units
        left -= take
        if not left:
            break
    return total


def mig_unit_counts(busy: frozenset[str], table: dict, *, cluster_ids: list[int] | None = None) -> list[dict]:
    """Present MIG instances (optionally of some clusters) with their availability as approval reads it
    (MigInstanceQuerySet.annotate_availability(fleet=True), the tier policies `table` written in), counted by
    cluster, node tier, GPU catalog product, profile (product, name, compute slices), availability, `reserved`
    and `admitted` (the node's tier admits the profile). One query over every instance: tier_plan() and the
    dashboard's unit groups share its rows rather than each reading the 180,000 instances of a fleet.

    Keys: cluster_id, tier, gpu_product, product, name, compute_slices, availability, reserved, admitted, n.
    """
    # Not narrowed with `within` to the clusters: the holders would then be joined to their instances'
    # GPUs and nodes, dearer than hashing the fleet's active MIG allocations from their index (bench fleet).
    instances = MigInstance.objects.annotate_availability(busy, fleet=True, table=table).annotate(
        admitted=as_boolean(admitted_q("gpu__", table))
    )
    if cluster_ids is not None:
        instances = instances.filter(gpu__node__cluster_id__in=cluster_ids)
    node = "gpu__node__"
    names = {
        f"{node}cluster_id": "cluster_id",
        f"{node}tier": "tier",
        "gpu__catalog_product": "gpu_product",
        "profile__product": "product",
        "profile__name": "name",
        "profile__compute_slices": "compute_slices",
    }
    rows = instances.values(*names, "availability", "reserved", "admitted").annotate(n=Count("pk")).order_by()
    return [{names.get(key, key): value for key, value in row.items()} for row in rows]


def _count_mig(tally: _Tally, busy: frozenset[str], cluster, table: dict, counts: list[dict] | None) -> None:
    """MIG instances: those the node's tier's policy admits (admitted_q, the TierProfilePolicy rows in SQL, as
    approval's availability reads them) with their availability; the others are withheld, held or busy or
    not (a unit allocated before the policy changed shows In use until freed, but is no capacity of its tier).
    Every tier's node may hand out its admitted instances: a request naming the node's tier reaches them.
    `counts`: mig_unit_counts() of the same instances, when the caller read them."""
    if counts is None:
        counts = mig_unit_counts(busy, table, cluster_ids=None if cluster is None else [cluster.pk])
    for row in counts:
        tier, n, availability = row["tier"], row["n"], row["availability"]
        if not row["admitted"]:
            tally.withheld[tier] += n
            continue
        spec = tally.spec(tier, SpecKind.MIG, row["product"], row["name"], None)
        spec.total += n
        if row["reserved"] or availability == Availability.ENDING:
            spec.reserved += n
        elif availability == Availability.FREE:
            spec.free += n
    node = "gpu__node__"
    # The same instances without their availability (the reserve and the GPUs per spec need only the layout).
    carried = MigInstance.objects.present().filter(admitted_q("gpu__", table))
    if cluster is not None:
        carried = carried.filter(gpu__node__cluster=cluster)
    carried = carried.values(f"{node}cluster_id", f"{node}tier", "gpu_id", "profile__product", "profile__name")
    per_gpu: Counter = Counter()
    for row in carried.annotate(n=Count("pk")).order_by():
        tier = row[f"{node}tier"]
        per_gpu[(row[f"{node}cluster_id"], tier, row["gpu_id"])] += row["n"]
        tally.spec(tier, SpecKind.MIG, row["profile__product"], row["profile__name"], None).gpus += 1
    for (cluster_id, tier, _gpu), n in per_gpu.items():
        tally.per_gpu[(cluster_id, tier)][n] += 1


def _count_whole(tally: _Tally, busy: frozenset[str], gpus) -> None:
    """Whole GPUs (GpuCapacity.objects.whole_gpu_hosts(), availability as approval reads it), every present
    GPU per tier, and the GPUs of no kind of unit (MIG off, neither whole-GPU, shared nor vGPU hosts)."""
    hosts = gpus.whole_gpu_hosts().annotate_availability(busy, fleet=True)
    rows = hosts.values("node__cluster_id", "node__tier", "catalog_product", "product", "availability", "reserved")
    for row in rows.annotate(n=Count("pk")).order_by():
        tier, n, availability = row["node__tier"], row["n"], row["availability"]
        product = _product(row["catalog_product"], row["product"])
        spec = tally.spec(tier, SpecKind.FULL, product, product, 1)
        spec.gpus += n
        spec.total += n
        if row["reserved"] or availability == Availability.ENDING:
            spec.reserved += n
        elif availability == Availability.FREE:
            spec.free += n
        tally.per_gpu[(row["node__cluster_id"], tier)][1] += n
    present = gpus.present().values("node__tier").annotate(n=Count("pk"))
    for row in present.order_by():
        tally.gpus[row["node__tier"]] += row["n"]
    unserved = (
        gpus.units()
        .exclude(pk__in=GpuCapacity.objects.whole_gpu_hosts().values("pk"))
        .exclude(pk__in=GpuCapacity.objects.timeslice_hosts().values("pk"))
        .exclude(pk__in=GpuCapacity.objects.vgpu_hosts().values("pk"))
    )
    for row in unserved.values("node__tier").annotate(n=Count("pk")).order_by():
        tally.unserved[row["node__tier"]] += row["n"]


def _count_shares(tally: _Tally, gpus) -> None:
    """Time-slice replicas and MPS clients (GpuCapacity.objects.timeslice_hosts()) and vGPUs of each vm-vgpu
    node's type (vgpu_hosts(); per GPU, the type's vGPUs per GPU): shares, those held (annotate_shares()),
    and those free on GPUs that meet the unit conditions (with_free_shares()'s)."""
    # The node's configured type (its nvidia.com/vgpu.config), as approval's vgpu_hosts(type) reads it; not
    # whichever type the device plugin happens to advertise first.
    vgpu_type = vgpu_offers().order_by("profile_name")
    usable = as_boolean(Q(*GpuCapacity.objects.share_conditions()))
    columns = ("node__cluster_id", "node__tier", "catalog_product", "product", "usable")
    sliced = (
        gpus.units()
        .timeslice_hosts()
        .annotate_shares()
        .annotate(usable=usable)
        .values(*columns, "node__sharing_strategy", "shares")
        .annotate(gpus=Count("pk"), held=Sum("held"))
    )
    for row in sliced.order_by():
        kind = MPS if row["node__sharing_strategy"] == MPS else SpecKind.TIMESLICE
        product = _product(row["catalog_product"], row["product"])
        _add_shares(tally, row, kind, product, product, row["shares"])
    vgpus = (
        gpus.units()
        .vgpu_hosts()
        .annotate_shares(0)
        .annotate(usable=usable, vgpu_type=Subquery(vgpu_type.values("profile_name")[:1]))
        .values(*columns, "vgpu_type")
        .annotate(gpus=Count("pk"), held=Sum("held"))
    )
    for row in vgpus.order_by():
        vgpu = VGPU_TYPES.get(row["vgpu_type"] or "")
        if vgpu is None:  # a type gpuaas does not know: approval never hands it out
            tally.unserved[row["node__tier"]] += row["gpus"]
            continue
        _add_shares(tally, row, SpecKind.VGPU, vgpu.product, vgpu.name, vgpu.max_per_gpu)


def _add_shares(tally: _Tally, row: dict, kind: str, product: str, name: str, per_gpu: int) -> None:
    tier = row["node__tier"]
    spec = tally.spec(tier, kind, product, name, per_gpu)
    total = row["gpus"] * per_gpu
    held = min(row["held"] or 0, total)
    spec.gpus += row["gpus"]
    spec.total += total
    spec.reserved += held
    if row["usable"]:
        spec.free += total - held
    tally.per_gpu[(row["node__cluster_id"], tier)][per_gpu] += row["gpus"]


def current_capacity_plan(*, cluster=None, node_group: str | None = None, nodes=None) -> dict:
    """The present GPUs (optionally of one cluster, node group or node list) grouped by node tier, product and
    use: MIG layout, time-slice replicas, or whole. `slots` is what the layout or replica count carries before
    the tier policy and availability: tier_plan() counts what approval hands out."""
    gpus = GpuCapacity.objects.present().select_related("node")
    if cluster is not None:
        gpus = gpus.filter(node__cluster=cluster)
    if node_group is not None:
        gpus = gpus.filter(node__node_group=node_group)
    if nodes is not None:
        gpus = gpus.filter(node__in=nodes)
    layouts: dict[int, list[str]] = {}
    for gpu_id, name in MigInstance.objects.active().filter(gpu__in=gpus).values_list("gpu_id", "profile__name"):
        layouts.setdefault(gpu_id, []).append(name)
    groups: Counter = Counter()
    for gpu in gpus.order_by("node_id", "index"):
        product = find_product(gpu.catalog_product or gpu.product)
        key_product = product.key if product else (gpu.catalog_product or gpu.product)
        tier = gpu.node.tier
        if gpu.mig_mode_current and product is not None:
            groups[(tier, key_product, tuple(sorted(layouts.get(gpu.pk, []))), None)] += 1
        elif gpu.node.timeslice_replicas > 1:
            groups[(tier, key_product, None, gpu.node.timeslice_replicas)] += 1
        else:
            groups[(tier, key_product, None, None)] += 1

    def order(item):  # by tier, product, then MIG, time-sliced, whole; then layout
        (tier, product, layout, replicas), _ = item
        rank = TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)
        return rank, product, 0 if layout is not None else (1 if replicas else 2), layout or (), replicas or 0

    out = []
    for (tier, product, layout, replicas), count in sorted(groups.items(), key=order):
        per_gpu = len(layout) if layout is not None else (replicas or 1)
        out.append(
            {
                "tier": tier,
                "product": product,
                "gpus": count,
                "use": "mig" if layout is not None else ("timeslice" if replicas else "full"),
                "layout": list(layout) if layout is not None else None,
                "replicas": replicas,
                "slots": count * per_gpu,
            }
        )
    return {"gpus": sum(groups.values()), "groups": out}


def proposed_capacity_plan(product: str, gpus: int, *, layout=None, timeslice_replicas: int | None = None) -> dict:
    """tiers.capacity_plan for a proposal; ValueError (with the validator's reason) if it is invalid."""
    return tiers.capacity_plan(product, gpus, layout=layout, timeslice_replicas=timeslice_replicas)
