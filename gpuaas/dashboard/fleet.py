"""Fleet-wide reads: cluster cards and the profile distribution, as SQL aggregates.

Units are counted in the database, grouped by (cluster, product, profile, availability, reserved),
so the number of queries stays fixed however many GPUs the fleet holds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

from django.contrib import admin
from django.db.models import Count, Q
from django.urls import reverse
from django.utils import timezone

from capacity import tiers
from capacity.choices import MigInstanceState, Tier
from capacity.mig.share import held_share, mig_share
from capacity.models import USABLE_HEALTH, Cluster, GpuCapacity, NodeCapacity, WorkloadProfile
from capacity.services import planning
from pools.choices import RequestState
from pools.models import Allocation, PoolRequest, gpu_count

from . import sources, timeseries, upgrades
from .status import FULL, SHAPE_LABELS, SHAPES, STATUSES, UnitStatus, shape_of, status_of


@dataclass(frozen=True)
class UnitGroup:
    """`count` units of one shape on one cluster, all in the same status."""

    cluster_id: int
    product: str
    shape: str
    status: str
    allocated: bool
    count: int
    gpus: Fraction  # the units' size in GPUs, summed


def unit_groups(
    cluster_ids: list[int] | None = None,
    busy_devices: frozenset[str] | None = None,
    table: dict | None = None,
    mig_counts: list[dict] | None = None,
) -> list[UnitGroup]:
    """Every present unit, counted by cluster, product, shape and status. Two queries, plus one for the busy
    devices and one for the tier policies unless the caller read them (`busy_devices` as in
    GpuCapacityQuerySet.annotate_availability(), `table` as capacity.tiers.policies()), less one when it read
    the MIG instances' counts (`mig_counts`: planning.mig_unit_counts() of the same clusters, shared with the
    capacity plan).

    Status is the unit's availability (the approval's definition).
    """
    if busy_devices is None:
        busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
    table = tiers.policies() if table is None else table
    if mig_counts is None:
        # fleet=True: hashed subqueries, not a probe per unit, as this reads every unit
        # (capacity.models.availability); the tier policies as literals, not a subquery per instance.
        mig_counts = planning.mig_unit_counts(busy_devices, table, cluster_ids=cluster_ids)
    elif cluster_ids is not None:
        wanted = set(cluster_ids)
        mig_counts = [row for row in mig_counts if row["cluster_id"] in wanted]
    full = GpuCapacity.objects.units().annotate_availability(busy_devices, fleet=True)
    if cluster_ids is not None:
        full = full.filter(node__cluster_id__in=cluster_ids)
    full_rows = (
        full.values("node__cluster_id", "catalog_product", "availability", "reserved")
        .annotate(n=Count("pk"))
        .order_by()
    )
    groups = []
    for row in mig_counts:
        slices = row["compute_slices"]
        product = row["gpu_product"]
        groups.append(
            UnitGroup(
                cluster_id=row["cluster_id"],
                product=product,
                shape=shape_of(slices),
                status=status_of(row["availability"]),
                allocated=bool(row["reserved"]),
                count=row["n"],
                gpus=mig_share(product, row["name"], slices) * row["n"],
            )
        )
    for row in full_rows:
        groups.append(
            UnitGroup(
                cluster_id=row["node__cluster_id"],
                product=row["catalog_product"],
                shape=FULL,
                status=status_of(row["availability"]),
                allocated=bool(row["reserved"]),
                count=row["n"],
                gpus=Fraction(row["n"]),
            )
        )
    return groups


def profile_distribution(groups: list[UnitGroup]) -> list[dict]:
    """Rows 1g, 2g, 3g, 4g, 7g, Full with the number of units in each status and the total, and the GPUs
    they make (each unit its share of a GPU)."""
    counts: dict[str, dict[str, int]] = {shape: dict.fromkeys(STATUSES, 0) for shape in SHAPES}
    gpus = dict.fromkeys(SHAPES, Fraction(0))
    for group in groups:
        counts[group.shape][group.status] += group.count
        gpus[group.shape] += group.gpus
    return [
        {
            "shape": shape,
            "label": SHAPE_LABELS[shape],
            **counts[shape],
            "total": sum(counts[shape].values()),
            "gpus": gpu_count(gpus[shape]),
        }
        for shape in SHAPES
    ]


def _round(value: Fraction, places: int = 2) -> float:
    return round(float(value), places)


def _percent(part: Fraction | int, whole: Fraction | int) -> float | None:
    return round(100 * float(part) / float(whole), 1) if whole else None


def cluster_cards(clusters: list[Cluster], groups: list[UnitGroup]) -> list[dict]:
    """One card per cluster: nodes, GPUs, MIG instances, units by status, GPUs allocated and free.

    Allocated and free are measured in GPUs so clusters carved differently compare at a glance: each
    held unit (an active pools.Allocation on a present GPU) weighs its share of the GPU
    (capacity.mig.share.held_share: a 3g.40gb of an H100 is 1/2, the larger of 3/7 compute and 4/8
    memory; a time-slice replica 1 / its node's replicas; as billing charges it), a whole GPU 1: the
    figure the pool cards and the API give. Free = present GPUs - allocated, so uncarved MIG slices and
    unheld replicas count as free. Three queries besides `groups`.
    """
    ids = [c.pk for c in clusters]
    nodes = {
        row["cluster_id"]: row
        for row in NodeCapacity.objects.present()
        .filter(cluster_id__in=ids)
        .values("cluster_id")
        .annotate(total=Count("pk"), schedulable=Count("pk", filter=Q(ready=True, cordoned=False)))
        .order_by()
    }
    gpus = {
        row["node__cluster_id"]: row
        for row in GpuCapacity.objects.present()
        .filter(node__cluster_id__in=ids)
        .values("node__cluster_id")
        .annotate(
            total=Count("pk"),
            mig_enabled=Count("pk", filter=Q(mig_mode_current=True)),
            unhealthy=Count("pk", filter=~Q(health__in=USABLE_HEALTH)),
        )
        .order_by()
    }
    # Present GPUs and instances as join conditions (GpuCapacityQuerySet.present(), MigInstanceQuerySet.present()
    # on the joined rows), not `IN (present())`: PostgreSQL built those subqueries' hashes over every GPU and
    # instance of the fleet once per parallel worker (2.4 s of the dashboard at 100,000 GPUs).
    instance = "mig_instance__"
    held = (
        Allocation.objects.active()
        .filter(gpu__lost_at__isnull=True, gpu__node__gone_at__isnull=True, gpu__node__cluster_id__in=ids)
        .filter(
            Q(mig_instance__isnull=True)
            | Q(
                **{
                    f"{instance}state": MigInstanceState.ACTIVE,
                    f"{instance}gpu__lost_at__isnull": True,
                    f"{instance}gpu__node__gone_at__isnull": True,
                }
            )
        )
        .counted("gpu__node__cluster_id")
    )
    by_cluster: dict[int, list[UnitGroup]] = defaultdict(list)
    for group in groups:
        by_cluster[group.cluster_id].append(group)
    cards = []
    for cluster in clusters:
        mine = by_cluster[cluster.pk]
        units = {status: sum(g.count for g in mine if g.status == status) for status in STATUSES}
        allocated = held.get((cluster.pk,), (0, Fraction(0)))[1]
        in_use = sum((g.gpus for g in mine if g.status == UnitStatus.IN_USE), Fraction(0))
        gpu_row = gpus.get(cluster.pk, {})
        present = gpu_row.get("total", 0)
        node_row = nodes.get(cluster.pk, {})
        cards.append(
            {
                "id": cluster.pk,
                "name": cluster.name,
                "status": cluster.status,
                "status_label": cluster.get_status_display(),
                "last_success_at": cluster.last_success_at.isoformat() if cluster.last_success_at else None,
                "nodes": node_row.get("total", 0),
                "nodes_schedulable": node_row.get("schedulable", 0),
                "gpus": present,
                "gpus_mig_enabled": gpu_row.get("mig_enabled", 0),
                "gpus_unhealthy": gpu_row.get("unhealthy", 0),
                "mig_instances": sum(g.count for g in mine if g.shape != FULL),
                "units": {**units, "total": sum(units.values())},
                "gpu_equivalents": {
                    "total": present,
                    "allocated": gpu_count(allocated),
                    "free": gpu_count(present - allocated),
                    "in_use": gpu_count(in_use),
                },
                "allocated_pct": _percent(allocated, present),
                "in_use_pct": _percent(in_use, present),
            }
        )
    return cards


def tier_policies(table: dict | None = None) -> dict:
    """The tier rules that withhold units ("tier 1 takes 3g and larger") and where to edit them. One query,
    unless the caller read the policies (`table`, capacity.tiers.policies())."""
    table = tiers.policies() if table is None else table
    return {
        "rules": [tiers.rule(tier, table) for tier in Tier.values if not table.get(tier, tiers.Policy()).admits_all],
        "admin_url": reverse("admin:capacity_tierprofilepolicy_changelist"),
    }


def capacity_plan_panel(
    busy_devices: frozenset[str] | None = None, table: dict | None = None, mig_counts: list[dict] | None = None
) -> dict:
    """The live plan per tier (capacity.services.planning.tier_plan: what approval would hand out on each tier's
    nodes, and the maintenance reserve), as a panel. The figures the admin's Capacity plan page and
    /api/v1/capacity-plan/ show; seven queries given the busy devices and the tier policies, six given the
    fleet's planning.mig_unit_counts() too."""
    plan = planning.tier_plan(busy_devices=busy_devices, table=table, mig_counts=mig_counts)
    items = [
        {
            "id": row.tier or "none",
            "tier": row.label,
            "rule": row.rule,
            "gpus": row.gpus,
            "total": row.total,
            "reserved": row.reserved,
            "free": row.free,
            "unavailable": row.unavailable,
            "withheld": row.withheld,
            "reserve": row.reserve,
            "free_after_reserve": row.free_after_reserve,
            "url": reverse("admin:capacity_capacity_plan"),
        }
        for row in plan.tiers
    ]
    return {
        "available": True,
        "summary": PLAN_NOTE.format(gpus=plan.reserve_gpus, s="" if plan.reserve_gpus == 1 else "s"),
        "columns": [
            {"key": "tier", "label": "Tier", "link": "url"},
            {"key": "rule", "label": "MIG profiles"},
            {"key": "gpus", "label": "GPUs", "num": True, "digits": 0},
            {"key": "total", "label": "Units", "num": True, "digits": 0},
            {"key": "reserved", "label": "Reserved", "num": True, "digits": 0},
            {"key": "free", "label": "Free", "num": True, "digits": 0},
            {"key": "unavailable", "label": "Unavailable", "num": True, "digits": 0},
            {"key": "withheld", "label": "Withheld by tier policy", "num": True, "digits": 0},
            {"key": "reserve", "label": "Maintenance reserve", "num": True, "digits": 0},
            {"key": "free_after_reserve", "label": "Free after reserve", "num": True, "digits": 0},
        ],
        "items": items,
        "empty": "No GPUs discovered yet.",
    }


PLAN_NOTE = (
    "Units approval would hand out on each tier's nodes: MIG instances the tier's policy admits, whole GPUs, "
    "time-slice replicas, MPS clients and vGPUs. The maintenance reserve is the units of the {gpus} GPU{s} "
    "per cluster and tier that carry the most: keep them free to drain a GPU without refusing work."
)
PENDING_SHOWN = 20
# The subtitle under the cluster cards, its example worked out by the rule the numbers use.
GPUS_NOTE = (
    "Allocated and free are counted in GPUs, each held unit as its share of a GPU, as billing charges it: "
    f"a 3g.40gb of an H100 is {held_share('mig', 'H100-80GB', '3g.40gb', 3, None)} of a GPU, a 1g.10gb "
    f"{held_share('mig', 'H100-80GB', '1g.10gb', 1, None)}, a time-slice replica 1 / its node's replicas."
)


def pending_approvals() -> dict:
    """Submitted pool requests waiting for an operator, oldest first. Two queries."""
    submitted = PoolRequest.objects.filter(state=RequestState.SUBMITTED)
    model_admin = admin.site._registry.get(PoolRequest)
    offered = set(getattr(model_admin, "actions", None) or [])
    changelist = reverse("admin:pools_poolrequest_changelist")
    rows = submitted.select_related("project", "requested_by").order_by("created_at", "id")[:PENDING_SHOWN]
    return {
        "count": submitted.count(),
        "queue_url": changelist + f"?state__exact={RequestState.SUBMITTED}",
        # The admin's own actions, posted from the dashboard: each opens the action's reason page.
        "action_url": changelist,
        "actions": [
            {"name": name, "label": label}
            for name, label in (("approve_selected", "Approve…"), ("reject_selected", "Reject…"))
            if name in offered
        ],
        "items": [
            {
                "id": r.pk,
                "project": r.project.slug,
                "spec": r.spec_label,
                "count": r.count,
                "isolation": r.get_isolation_display(),
                "tier": r.get_tier_display(),
                "requested_by": r.requested_by.get_username() if r.requested_by else None,
                "created_at": r.created_at.isoformat(),
                "url": reverse("admin:pools_poolrequest_change", args=[r.pk]),
            }
            for r in rows
        ],
    }


def overview() -> dict:
    """Everything the operator dashboard shows, as one JSON-able dict (a fixed number of queries)."""
    clusters = list(Cluster.objects.order_by("name"))
    ids = [c.pk for c in clusters]
    busy = WorkloadProfile.objects.running().multi_device_uuids()  # read once: the cards and the plan
    table = tiers.policies()
    # The MIG instances' counts of the whole fleet, read once for the cards, the profiles and the plan.
    mig_counts = planning.mig_unit_counts(busy, table)
    groups = unit_groups(ids, busy, table, mig_counts)
    cards = cluster_cards(clusters, groups)
    health = sources.health_counters(ids)
    series = timeseries.cluster_series(clusters)
    activity = timeseries.cluster_activity(series)
    for card in cards:
        card["health"] = health[card["id"]]
        card["activity"] = activity.get(card["id"])
        card["url"] = reverse("admin:gpuaas_dashboard_cluster", args=[card["id"]])
    totals = {
        "clusters": len(clusters),
        "nodes": sum(c["nodes"] for c in cards),
        "gpus": sum(c["gpus"] for c in cards),
        "mig_instances": sum(c["mig_instances"] for c in cards),
    }
    return {
        "generated_at": timezone.now().isoformat(),
        "totals": totals,
        "gpus_note": GPUS_NOTE,
        "clusters": cards,
        "profiles": profile_distribution(groups),
        "tier_policies": tier_policies(table),
        "capacity_plan": capacity_plan_panel(busy, table, mig_counts),
        "pending": pending_approvals(),
        "driver_upgrades": upgrades.driver_upgrades_panel(),
        "health_events": sources.recent_health_events(),
        "idle_reservations": sources.idle_reservations(),
        "trespass_events": sources.trespass_events(),
        "costs": sources.month_costs(),
        "series": series,
    }
