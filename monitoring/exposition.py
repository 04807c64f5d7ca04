"""gpuaas's own /metrics: pool, project and health gauges for an existing Prometheus to scrape.

Computed from the database at scrape time (a handful of grouped queries; SM activity from the
last finished 5-minute rollup bucket), rendered by monitoring/adapters/prometheus.py.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import timedelta

from django.db.models import Count, F, Q
from django.utils import timezone

from capacity.models import GpuCapacity
from pools.models import Allocation, GpuPool

from . import readers
from .adapters.prometheus import Gauge, render
from .choices import RollupLevel
from .models import Collector, HealthEvent, IdleReservation, RollupRun, TrespassEvent

POOL_LABELS = ("cluster", "project", "pool")


def _pool_series(pools, allocations) -> dict[int, list[str]]:
    """Each pool's clusters, the `cluster` label of its series: the clusters it holds units on (PoolCluster,
    home first), any cluster one of its units sits on, and its home cluster when it has neither."""
    clusters: dict[int, list[str]] = {p.pk: [part.cluster.name for part in p.pool_clusters.all()] for p in pools}
    for a in allocations:
        if a.cluster_name not in clusters[a.pool_id]:
            clusters[a.pool_id].append(a.cluster_name)
    for p in pools:
        clusters[p.pk] = clusters[p.pk] or [p.cluster.name]
    return clusters


def _pool_gauge(name: str, text: str, pools, clusters, values: dict[tuple[int, str], float]) -> Gauge:
    """One series per (pool, cluster it holds units on), 0 where `values` has none."""
    gauge = Gauge(name, text, POOL_LABELS)
    gauge.samples = [
        ((cluster, p.project.slug, p.name), float(values.get((p.pk, cluster), 0)))
        for p in pools
        for cluster in clusters[p.pk]
    ]
    return gauge


def pool_gauges(*, now=None) -> list[Gauge]:
    """The per-pool gauges, one series per (pool, cluster): `cluster` is where the units are, so a pool
    across clusters has a series on each of them (sum by project and pool for the pool's totals)."""
    now = now or timezone.now()
    pools = list(GpuPool.objects.held().with_clusters().select_related("project", "cluster").order_by("pk"))
    allocations = list(
        Allocation.objects.active()
        .filter(pool__in=[p.pk for p in pools])
        .annotate(cluster_name=F("gpu__node__cluster__name"))
        .order_by("pk")
    )
    clusters = _pool_series(pools, allocations)
    where = {a.pk: (a.pool_id, a.cluster_name) for a in allocations}
    units = _pool_gauge(
        "gpuaas_pool_units",
        "Units (MIG instances, GPUs, replicas) a pool holds now on the cluster.",
        pools,
        clusters,
        Counter(where.values()),
    )

    series = readers.allocation_series(allocations)
    done = RollupRun.objects.filter(level=RollupLevel.FIVE_MINUTES).values_list("complete_until", flat=True).first()
    end = done or now
    stats = readers.window_stats(sorted(set(series.values())), end - timedelta(minutes=5), end)
    weighted: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for a in allocations:
        s = stats.get(series.get(a.pk, -1))
        if s is not None and s.sm_active_avg is not None:
            weighted[where[a.pk]][0] += s.sm_active_avg * (a.compute_slices or 1)
            weighted[where[a.pk]][1] += a.compute_slices or 1
    sm = Gauge(
        "gpuaas_pool_sm_active_avg",
        "SM activity of a pool's MIG and full-GPU units on the cluster over the last finished 5 minutes, "
        "percent, weighted by compute slices.",
        POOL_LABELS,
    )
    measured = Gauge(
        "gpuaas_pool_sm_measured_slices",
        "Compute slices of the units averaged in gpuaas_pool_sm_active_avg (its weight across clusters).",
        POOL_LABELS,
    )
    for p in pools:
        for cluster in clusters[p.pk]:
            total, slices = weighted.get((p.pk, cluster), (0.0, 0.0))
            if slices:
                sm.samples.append(((cluster, p.project.slug, p.name), total / slices))
                measured.samples.append(((cluster, p.project.slug, p.name), slices))

    gpu_units: dict[int, set[tuple[int, str]]] = defaultdict(set)
    mig_units: dict[int, set[tuple[int, str]]] = defaultdict(set)
    for a in allocations:
        gpu_units[a.gpu_id].add(where[a.pk])
        if a.mig_instance_id:
            mig_units[a.mig_instance_id].add(where[a.pk])
    per_part: Counter = Counter()
    events = HealthEvent.objects.open().filter(Q(gpu_id__in=gpu_units) | Q(mig_instance_id__in=mig_units))
    for gpu_id, mig_id in events.values_list("gpu_id", "mig_instance_id"):
        per_part.update(mig_units.get(mig_id, set()) if mig_id else gpu_units.get(gpu_id, set()))
    pool_events = _pool_gauge(
        "gpuaas_pool_health_events_open",
        "Open health events on a pool's units on the cluster.",
        pools,
        clusters,
        per_part,
    )

    flags = {
        (row["allocation__pool_id"], row["allocation__gpu__node__cluster__name"]): row["n"]
        for row in IdleReservation.objects.open()
        .values("allocation__pool_id", "allocation__gpu__node__cluster__name")
        .annotate(n=Count("id"))
        .order_by()
    }
    idle = _pool_gauge(
        "gpuaas_pool_idle_reservations_open",
        "Units of a pool on the cluster flagged idle (open flags).",
        pools,
        clusters,
        flags,
    )
    return [units, sm, measured, pool_events, idle]


def gauges(*, now=None) -> list[Gauge]:
    open_events = HealthEvent.objects.open()
    by_rule = Gauge(
        "gpuaas_gpu_health_events_open", "Open health events by cluster, level and rule.", ("cluster", "level", "rule")
    )
    by_rule.samples = [
        ((row["gpu__node__cluster__name"], row["level"], row["rule"]), float(row["n"]))
        for row in open_events.values("gpu__node__cluster__name", "level", "rule")
        .annotate(n=Count("id"))
        .order_by("gpu__node__cluster__name", "level", "rule")
    ]
    gpus = Gauge("gpuaas_gpus", "Present GPUs by cluster and health.", ("cluster", "health"))
    gpus.samples = [
        ((row["node__cluster__name"], row["health"]), float(row["n"]))
        for row in GpuCapacity.objects.present()
        .values("node__cluster__name", "health")
        .annotate(n=Count("id"))
        .order_by("node__cluster__name", "health")
    ]
    collectors = Gauge(
        "gpuaas_metrics_collector_last_success_seconds",
        "Unix time of a metrics source's last successful collection.",
        ("cluster", "source", "target"),
    )
    collectors.samples = [
        ((c.cluster.name, c.source, c.target), c.last_success_at.timestamp())
        for c in Collector.objects.select_related("cluster").filter(last_success_at__isnull=False)
    ]
    trespass = Gauge(
        "gpuaas_trespass_events_open",
        "Open trespass events: a unit used by a pod of another project, or used while unallocated "
        "(owner or project empty when there is none or it is unknown).",
        ("cluster", "kind", "owner", "project"),
    )
    trespass.samples = [
        (
            (
                row["gpu__node__cluster__name"],
                row["kind"],
                row["owner_project__slug"] or "",
                row["project__slug"] or "",
            ),
            float(row["n"]),
        )
        for row in TrespassEvent.objects.open()
        .values("gpu__node__cluster__name", "kind", "owner_project__slug", "project__slug")
        .annotate(n=Count("id"))
        .order_by("gpu__node__cluster__name", "kind", "owner_project__slug", "project__slug")
    ]
    return [*pool_gauges(now=now), by_rule, gpus, collectors, trespass]


def exposition() -> tuple[bytes, str]:
    return render(gauges())
