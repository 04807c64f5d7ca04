"""Rebalancing: the MIG layout for the next maintenance window, from the last period's demand. Read-only
until an operator creates the reconfigurations it proposes.

propose_rebalance(): from the last N days' demand per profile (pools.PoolRequest units live in the
period, or the MIG instances monitoring saw in use if that is more), the layout for the next
maintenance window (capacity.mig.planner.plan_onto_gpus: allocated instances never move, fewest
GPUs touched, and a GPU only ever gets profiles its node's tier allows: TierProfilePolicy, the tier
being the node's TierAssignment where gpuaas owns it), with the slots gained and lost.
create_rebalance_reconfigurations() turns it into one MigReconfiguration per touched node.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Q, Sum
from django.utils import timezone

from capacity import tiers
from capacity.mig.catalog import get_product
from capacity.mig.planner import GpuState, Reconfiguration, plan_onto_gpus
from capacity.models import GpuCapacity, MigInstance, NodeCapacity
from monitoring.models import Rollup1h, Series
from pools.models import Allocation, PoolRequest

from . import reconfiguration
from .reconfiguration.plan import next_window

# An instance counts as used when its SM activity peaked at or above this (percent) in an hour bucket.
USED_SM_ACTIVE_PCT = 5.0
# Pool-request states whose units count as demand (rejected ones too: unmet demand is demand).
DEMAND_STATES = ("submitted", "approved", "rejected", "provisioning", "active", "released", "expired", "failed")


def _excess(counts: dict[str, int], other: dict[str, int]) -> dict[str, int]:
    """Per profile, how many more `counts` has than `other` (profiles where it has more only)."""
    more = {p: counts.get(p, 0) - other.get(p, 0) for p in sorted(set(counts) | set(other))}
    return {p: n for p, n in more.items() if n > 0}


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
        return _excess(self.after, self.before)

    @property
    def lost(self) -> dict[str, int]:
        return _excess(self.before, self.after)

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
    busy_series = Rollup1h.objects.filter(
        bucket__gte=now - timedelta(days=days), sm_active_max__gte=USED_SM_ACTIVE_PCT
    ).values("series_id")
    rows = Series.objects.filter(
        pk__in=busy_series,
        mig_instance__gpu__node__cluster=cluster,
        mig_instance__profile__product=product,
    ).values_list("mig_instance__profile__name", flat=True)
    return dict(Counter(rows))


def _tier(node: NodeCapacity) -> str:
    """The node's tier: its TierAssignment's where gpuaas owns it (the label may lag), else the label's."""
    assignment = getattr(node, "tier_assignment", None)
    return assignment.tier if assignment is not None else node.tier


def propose_rebalance(cluster, product: str, *, days: int = 30, now: datetime | None = None) -> Rebalance:
    """The layout to apply in the next maintenance window for `product` GPUs of `cluster`."""
    now = now or timezone.now()
    product = get_product(product).key
    requested = requested_demand(cluster, product, days=days, now=now)
    used = used_instances(cluster, product, days=days, now=now)
    demand = {p: max(requested.get(p, 0), used.get(p, 0)) for p in sorted(set(requested) | set(used))}
    rows = list(
        GpuCapacity.objects.present()
        .filter(node__cluster=cluster, catalog_product=product, mig_mode_current=True)
        .filter(node__in=NodeCapacity.objects.present())
        .select_related("node__tier_assignment")
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
    table = tiers.policies()
    allowed = {tier: frozenset(tiers.allowed_profiles(tier, product, table)) for tier in {_tier(g.node) for g in rows}}
    states = [
        GpuState(str(g.pk), tuple(instances[g.pk]), frozenset(allocated[g.pk]), allowed[_tier(g.node)]) for g in rows
    ]
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
        proposal.next_windows[name] = next_window(node, now)
    return proposal


def create_rebalance_reconfigurations(proposal: Rebalance, *, backend: str, drain: bool, force: bool, actor=None):
    """One MigReconfiguration per touched node (operations.reconfiguration.create, which refuses
    outside a maintenance window unless forced). Returns (created, refusals {node: reason})."""
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
