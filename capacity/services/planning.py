"""Capacity planning (effective slots per tier) and rebalancing proposals. Read-only.

- current_capacity_plan(): slots per tier of the discovered GPUs, each GPU as it is now: a MIG
  layout (tier 1 arithmetic, capacity.mig.tiers), time-slice replicas of its node (tier 3), or a
  whole GPU. GPUs with the same product and use are summed through tiers.capacity_plan.
- proposed_capacity_plan(): the same for a proposed layout or replica count on N GPUs.
- propose_rebalance(): from the last N days' demand per profile (pools.PoolRequest units live in the
  period, or the MIG instances monitoring saw in use if that is more), the layout for the next
  maintenance window (capacity.mig.planner.plan_onto_gpus: allocated instances never move, fewest
  GPUs touched), with the slots gained and lost.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.apps import apps
from django.db.models import Q, Sum
from django.utils import timezone

from capacity.mig import tiers
from capacity.mig.catalog import find_product, get_product
from capacity.mig.planner import GpuState, Reconfiguration, plan_onto_gpus
from capacity.models import GpuCapacity, MaintenanceWindow, MigInstance, NodeCapacity

# An instance counts as used when its SM activity peaked at or above this (percent) in an hour bucket.
USED_SM_ACTIVE_PCT = 5.0
# Pool-request states whose units count as demand (rejected ones too: unmet demand is demand).
DEMAND_STATES = ("submitted", "approved", "rejected", "provisioning", "active", "released", "expired", "failed")


def _merge_tiers(totals: dict, tiers_: dict) -> None:
    for tier, data in tiers_.items():
        into = totals.setdefault(tier, {"slots": 0, "by_spec": {}})
        into["slots"] += data["slots"]
        for spec, n in data["by_spec"].items():
            into["by_spec"][spec] = into["by_spec"].get(spec, 0) + n


def current_capacity_plan(*, cluster=None, node_group: str | None = None, nodes=None) -> dict:
    """Slots per tier of the present GPUs (optionally of one cluster, node group or node list)."""
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
        if gpu.mig_mode_current and product is not None:
            groups[(key_product, tuple(sorted(layouts.get(gpu.pk, []))), None)] += 1
        elif gpu.node.timeslice_replicas > 1:
            groups[(key_product, None, gpu.node.timeslice_replicas)] += 1
        else:
            groups[(key_product, None, None)] += 1
    out_groups, totals = [], {}

    def order(item):  # by product, then MIG, time-sliced, whole; then layout
        (product, layout, replicas), _ = item
        return product, 0 if layout is not None else (1 if replicas else 2), layout or (), replicas or 0

    for (product, layout, replicas), count in sorted(groups.items(), key=order):
        if find_product(product) is None:  # a GPU without MIG: whole or time-sliced only
            result = _plain_plan(product, count, replicas)
        else:
            result = tiers.capacity_plan(
                product, count, layout=list(layout) if layout is not None else None, timeslice_replicas=replicas
            )
        out_groups.append(
            {
                "product": product,
                "gpus": count,
                "use": "mig" if layout is not None else ("timeslice" if replicas else "full"),
                "layout": list(layout) if layout is not None else None,
                "replicas": replicas,
                "tiers": result["tiers"],
            }
        )
        _merge_tiers(totals, result["tiers"])
    return {"gpus": sum(groups.values()), "groups": out_groups, "totals": totals}


def _plain_plan(product: str, gpus: int, replicas: int | None) -> dict:
    if replicas:
        return {
            "tiers": {
                tiers.TIER_TIMESLICE: {
                    "slots": gpus * replicas,
                    "replicas": replicas,
                    "by_spec": {product: gpus * replicas},
                }
            }
        }
    return {"tiers": {tiers.TIER_FULL: {"slots": gpus, "by_spec": {product: gpus}}}}


def proposed_capacity_plan(product: str, gpus: int, *, layout=None, timeslice_replicas: int | None = None) -> dict:
    """tiers.capacity_plan for a proposal; ValueError (with the validator's reason) if it is invalid."""
    return tiers.capacity_plan(product, gpus, layout=layout, timeslice_replicas=timeslice_replicas)


# --- Rebalancing -------------------------------------------------------------------------------


@dataclass
class Rebalance:
    cluster: object
    product: str
    days: int
    requested: dict[str, int]
    used: dict[str, int]
    demand: dict[str, int]
    plan: Reconfiguration
    gpus: dict[str, GpuCapacity]  # planner gpu id -> row
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    next_windows: dict[str, tuple[datetime, datetime] | None] = field(default_factory=dict)

    @property
    def gained(self) -> dict[str, int]:
        return {
            p: self.after.get(p, 0) - self.before.get(p, 0)
            for p in sorted(set(self.after) | set(self.before))
            if self.after.get(p, 0) > self.before.get(p, 0)
        }

    @property
    def lost(self) -> dict[str, int]:
        return {
            p: self.before.get(p, 0) - self.after.get(p, 0)
            for p in sorted(set(self.after) | set(self.before))
            if self.before.get(p, 0) > self.after.get(p, 0)
        }

    def targets_by_node(self) -> dict[str, dict[str, list[dict]]]:
        """node name -> {gpu index: [{"profile", "start"}]} for every touched GPU (MigReconfiguration targets)."""
        out: dict[str, dict[str, list[dict]]] = {}
        for change in self.plan.changes:
            if not change.touched:
                continue
            gpu = self.gpus[change.gpu]
            final = sorted(change.keep + change.create, key=lambda p: p.start)
            out.setdefault(gpu.node.name, {})[str(gpu.index)] = [
                {"profile": p.profile, "start": p.start} for p in final
            ]
        return dict(sorted(out.items()))

    def to_dict(self) -> dict:
        return {
            "cluster": self.cluster.name,
            "product": self.product,
            "days": self.days,
            "requested": self.requested,
            "used": self.used,
            "demand": self.demand,
            "met": dict(self.plan.met),
            "unmet": dict(self.plan.unmet),
            "touched": self.plan.touched,
            "exact": self.plan.exact,
            "slots_before": self.before,
            "slots_after": self.after,
            "gained": self.gained,
            "lost": self.lost,
            "targets": self.targets_by_node(),
            "rows": [
                {
                    "profile": name,
                    "requested": self.requested.get(name, 0),
                    "used": self.used.get(name, 0),
                    "demand": self.demand.get(name, 0),
                    "before": self.before.get(name, 0),
                    "after": self.after.get(name, 0),
                }
                for name in sorted(set(self.demand) | set(self.before) | set(self.after))
            ],
            "next_windows": {
                n: ({"opens": w[0].isoformat(), "closes": w[1].isoformat()} if w else None)
                for n, w in self.next_windows.items()
            },
        }


def requested_demand(cluster, product: str, *, days: int, now: datetime) -> dict[str, int]:
    """MIG units per profile of the pool requests live during the last `days` days (cluster or any)."""
    from pools.models import PoolRequest

    since = now - timedelta(days=days)
    rows = (
        PoolRequest.objects.filter(spec_kind="mig", product=product, state__in=DEMAND_STATES)
        .filter(Q(cluster=cluster) | Q(cluster__isnull=True))
        .filter(start_at__lte=now)
        .filter(Q(end_at__isnull=True) | Q(end_at__gte=since))
        .exclude(profile_name="")
        .values("profile_name")
        .annotate(units=Sum("count"))
        .order_by("profile_name")
    )
    catalog = get_product(product)
    demand: Counter = Counter()
    for row in rows:
        try:
            demand[catalog.profile(row["profile_name"]).name] += row["units"]
        except KeyError:
            continue
    return dict(demand)


def used_instances(cluster, product: str, *, days: int, now: datetime) -> dict[str, int]:
    """MIG instances per profile that monitoring saw busy in the period ({} without monitoring data)."""
    try:
        rollup = apps.get_model("monitoring", "Rollup1h")
        series = apps.get_model("monitoring", "Series")
    except LookupError:
        return {}
    busy_series = rollup.objects.filter(
        bucket__gte=now - timedelta(days=days), sm_active_max__gte=USED_SM_ACTIVE_PCT
    ).values("series_id")
    rows = series.objects.filter(
        pk__in=busy_series,
        mig_instance__gpu__node__cluster=cluster,
        mig_instance__profile__product=product,
    ).values_list("mig_instance__profile__name", flat=True)
    return dict(Counter(rows))


def propose_rebalance(cluster, product: str, *, days: int = 30, now: datetime | None = None) -> Rebalance:
    """The layout to apply in the next maintenance window for `product` GPUs of `cluster`."""
    from pools.models import Allocation

    now = now or timezone.now()
    product = get_product(product).key
    requested = requested_demand(cluster, product, days=days, now=now)
    used = used_instances(cluster, product, days=days, now=now)
    demand = {p: max(requested.get(p, 0), used.get(p, 0)) for p in sorted(set(requested) | set(used))}
    rows = list(
        GpuCapacity.objects.present()
        .filter(node__cluster=cluster, catalog_product=product, mig_mode_current=True)
        .filter(node__in=NodeCapacity.objects.present())
        .select_related("node")
        .order_by("node__name", "index")
    )
    instances: dict[int, list[tuple[str, int]]] = {g.pk: [] for g in rows}
    for gpu_id, name, start in (
        MigInstance.objects.active().filter(gpu__in=rows).values_list("gpu_id", "profile__name", "placement_start")
    ):
        instances[gpu_id].append((name, start))
    allocated: dict[int, set[int]] = {g.pk: set() for g in rows}
    for gpu_id, start in (
        Allocation.objects.active()
        .filter(gpu__in=rows, mig_instance__isnull=False)
        .values_list("gpu_id", "mig_instance__placement_start")
    ):
        allocated[gpu_id].add(start)
    states = [GpuState(str(g.pk), tuple(instances[g.pk]), frozenset(allocated[g.pk])) for g in rows]
    # Allocated instances are pinned and serve their own requests: only the rest of the demand is planned.
    held = Counter(name for g in rows for name, start in instances[g.pk] if start in allocated[g.pk])
    plan = plan_onto_gpus(product, states, {p: max(0, n - held[p]) for p, n in demand.items()})
    before = Counter(name for gpu in instances.values() for name, _ in gpu)
    after: Counter = Counter()
    for change in plan.changes:
        final = change.keep + change.create if change.touched else change.keep
        after.update(p.profile for p in final)
    proposal = Rebalance(
        cluster=cluster,
        product=product,
        days=days,
        requested=requested,
        used=used,
        demand=demand,
        plan=plan,
        gpus={str(g.pk): g for g in rows},
        before=dict(sorted(before.items())),
        after=dict(sorted(after.items())),
    )
    for name in proposal.targets_by_node():
        node = next(g.node for g in rows if g.node.name == name)
        proposal.next_windows[name] = _next_window(node, now)
    return proposal


def _next_window(node: NodeCapacity, now: datetime) -> tuple[datetime, datetime] | None:
    openings = [w.next_opening(now) for w in MaintenanceWindow.objects.for_node(node)]
    openings = [o for o in openings if o is not None]
    return min(openings) if openings else None


def create_rebalance_reconfigurations(proposal: Rebalance, *, backend: str, drain: bool, force: bool, actor=None):
    """One MigReconfiguration per touched node (capacity.services.reconfiguration.create, which refuses
    outside a maintenance window unless forced). Returns (created, refusals {node: reason})."""
    from . import reconfiguration

    created, refused = [], {}
    for name, target in proposal.targets_by_node().items():
        node = NodeCapacity.objects.get(cluster=proposal.cluster, name=name)
        try:
            created.append(
                reconfiguration.create(
                    node, target, source="rebalance", backend=backend, drain=drain, force=force, actor=actor
                )
            )
        except (reconfiguration.ReconfigurationError, reconfiguration.IllegalTransition) as exc:
            refused[name] = str(exc)
    return created, refused
