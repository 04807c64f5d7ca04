"""gpuaas's own /metrics: pool, project and health gauges for an existing Prometheus to scrape.

Computed from the database at scrape time (a handful of grouped queries; SM activity from the
last finished 5-minute rollup bucket), rendered by monitoring/adapters/prometheus.py.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone

from capacity.models import GpuCapacity
from pools.models import Allocation, GpuPool

from . import readers
from .adapters.prometheus import Gauge, render
from .choices import RollupLevel
from .models import Collector, HealthEvent, IdleReservation, RollupRun, TrespassEvent

POOL_LABELS = ("cluster", "project", "pool")


def gauges(*, now=None) -> list[Gauge]:
    now = now or timezone.now()
    pools = list(
        GpuPool.objects.filter(released_at__isnull=True)
        .select_related("project", "cluster")
        .annotate(units=Count("allocations", filter=Q(allocations__released_at__isnull=True)))
        .order_by("pk")
    )
    labels = {p.pk: (p.cluster.name, p.project.slug, p.name) for p in pools}
    units = Gauge("gpuaas_pool_units", "Units (MIG instances, GPUs, replicas) a pool holds now.", POOL_LABELS)
    units.samples = [(labels[p.pk], float(p.units)) for p in pools]

    allocations = list(Allocation.objects.active().filter(pool__in=[p.pk for p in pools]).order_by("pk"))
    series = readers.allocation_series(allocations)
    done = RollupRun.objects.filter(level=RollupLevel.FIVE_MINUTES).values_list("complete_until", flat=True).first()
    end = done or now
    stats = readers.window_stats(sorted(set(series.values())), end - timedelta(minutes=5), end)
    weighted: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for a in allocations:
        s = stats.get(series.get(a.pk, -1))
        if s is not None and s.sm_active_avg is not None:
            weighted[a.pool_id][0] += s.sm_active_avg * (a.compute_slices or 1)
            weighted[a.pool_id][1] += a.compute_slices or 1
    sm = Gauge(
        "gpuaas_pool_sm_active_avg",
        "SM activity of a pool's MIG and full-GPU units over the last finished 5 minutes, percent, "
        "weighted by compute slices.",
        POOL_LABELS,
    )
    sm.samples = [(labels[pk], total / slices) for pk, (total, slices) in sorted(weighted.items()) if slices]

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
    gpu_pool: dict[int, set[int]] = defaultdict(set)
    mig_pool: dict[int, set[int]] = defaultdict(set)
    for a in allocations:
        gpu_pool[a.gpu_id].add(a.pool_id)
        if a.mig_instance_id:
            mig_pool[a.mig_instance_id].add(a.pool_id)
    per_pool: dict[int, int] = defaultdict(int)
    for gpu_id, mig_id in open_events.filter(Q(gpu_id__in=gpu_pool) | Q(mig_instance_id__in=mig_pool)).values_list(
        "gpu_id", "mig_instance_id"
    ):
        for pool_id in mig_pool.get(mig_id, set()) if mig_id else gpu_pool.get(gpu_id, set()):
            per_pool[pool_id] += 1
    pool_events = Gauge("gpuaas_pool_health_events_open", "Open health events on a pool's units.", POOL_LABELS)
    pool_events.samples = [(labels[p.pk], float(per_pool.get(p.pk, 0))) for p in pools]

    idle = Gauge("gpuaas_pool_idle_reservations_open", "Units of a pool flagged idle (open flags).", POOL_LABELS)
    flags = dict(
        IdleReservation.objects.open()
        .values("allocation__pool_id")
        .annotate(n=Count("id"))
        .values_list("allocation__pool_id", "n")
    )
    idle.samples = [(labels[p.pk], float(flags.get(p.pk, 0))) for p in pools]

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
    return [units, sm, pool_events, idle, by_rule, gpus, collectors, trespass]


def exposition() -> tuple[bytes, str]:
    return render(gauges())
