"""Reading metrics back: time series at a step, aggregates over a window, latest values, pool summaries.

Step "raw" reads samples; "5m" and "1h" read rollups for the buckets the rollup job has finished
(RollupRun.complete_until) and aggregate raw samples on the fly for the rest, so a chart is never
stale by a rollup period. `auto` picks raw up to 2 h, 5m up to 3 days, 1h beyond.

Visibility is the caller's business for the series (SeriesQuerySet.visible_to); `windows` limits
points to the periods a project held the unit (allocation windows), so a MIG instance that changed
hands never shows the previous holder's figures.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import F, FloatField, Max, Q, Sum
from django.db.models.functions import Cast

from capacity.choices import SpecKind
from capacity.models import WorkloadProfile
from capacity.services.workloads import physical_id
from pools.models import Allocation

from .. import backends
from ..buckets import BUCKET, GAUGES, floor, plain_number
from ..choices import RollupLevel
from ..models import Rollup1h, Rollup5m, RollupRun, Sample, Series
from .samples import sample_rows

STEPS = ("raw", "5m", "1h")
METRICS = GAUGES  # power_w, sm_active, gpu_util, mem_used_mib, temp_c
AGGREGATES = ("avg", "max", "min")
Window = tuple[datetime, datetime | None]


def auto_step(start: datetime, end: datetime) -> str:
    span = end - start
    if span <= timedelta(hours=2):
        return "raw"
    if span <= timedelta(days=3):
        return "5m"
    return "1h"


def _inside(ts: datetime, windows: list[Window], size: timedelta) -> bool:
    """Whether the point at `ts` covering `size` (0 for a raw sample) lies wholly inside a window.

    A bucket that straddles a hand-over would mix two holders' figures: it is left out.
    """
    for start, end in windows:
        if ts < start:
            continue
        if end is None or (ts + size <= end if size else ts < end):
            return True
    return False


def series_points(
    series_ids: list[int],
    start: datetime,
    end: datetime,
    *,
    step: str,
    aggregate: str = "avg",
    metrics: tuple[str, ...] = METRICS,
    windows: dict[int, list[Window]] | None = None,
) -> dict[int, list[dict]]:
    """series id -> [{"ts": ..., metric: value, ...}] in time order. `aggregate` picks avg/max/min of rollups."""
    if step == "raw":
        points = _raw_points(series_ids, start, end, metrics)
    else:
        points = _bucket_points(series_ids, start, end, step, aggregate, metrics)
    if windows is not None:
        size = BUCKET[step] if step != "raw" else timedelta(0)
        points = {
            sid: [p for p in rows if _inside(p["ts"], windows.get(sid, []), size)] for sid, rows in points.items()
        }
    return points


def _raw_points(series_ids, start, end, metrics) -> dict[int, list[dict]]:
    result: dict[int, list[dict]] = {sid: [] for sid in series_ids}
    for sid, ts, *values in sample_rows(series_ids, start, end, metrics):
        result[sid].append({"ts": ts, **dict(zip(metrics, values, strict=True))})
    return result


def _bucket_points(series_ids, start, end, step, aggregate, metrics) -> dict[int, list[dict]]:
    size = BUCKET[step]
    start = floor(start, size)
    model = Rollup5m if step == RollupLevel.FIVE_MINUTES else Rollup1h
    done = RollupRun.finished_until(step)
    rolled_end = min(end, done) if done else start
    result: dict[int, list[dict]] = {sid: [] for sid in series_ids}
    if rolled_end > start:
        columns = [f"{m}_{aggregate}" for m in metrics]
        rows = (
            model.objects.filter(series_id__in=series_ids, bucket__gte=start, bucket__lt=rolled_end)
            .order_by("series_id", "bucket")
            .values_list("series_id", "bucket", *columns)
        )
        for sid, bucket, *values in rows:
            result[sid].append({"ts": bucket, **dict(zip(metrics, values, strict=True))})
    tail_start = max(start, rolled_end)
    if tail_start < end:
        for sid, points in backends.raw_buckets(series_ids, tail_start, end, size, aggregate, metrics).items():
            result[sid].extend(points)
    return result


@dataclass(slots=True)
class Stats:
    """Aggregates of one series over a window. None = no value available (not zero)."""

    samples: int = 0
    sm_active_avg: float | None = None
    sm_active_max: float | None = None
    gpu_util_avg: float | None = None
    mem_used_max: int | None = None
    power_w_avg: float | None = None

    def coverage(self, window: timedelta, interval_s: int) -> float:
        expected = max(1, int(window.total_seconds() // interval_s))
        return min(1.0, self.samples / expected)


# Above this many ids a query is split: PostgreSQL takes at most 65,535 parameters per statement.
CHUNK = 5000


def _chunks(ids: list) -> list[list]:
    return [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]


def window_stats(series_ids: list[int], start: datetime, end: datetime) -> dict[int, Stats]:
    """Aggregates per series over [start, end): finished 5-minute rollups plus raw samples after them."""
    if len(series_ids) > CHUNK:
        result: dict[int, Stats] = {}
        for chunk in _chunks(series_ids):
            result.update(window_stats(chunk, start, end))
        return result
    done = RollupRun.finished_until(RollupLevel.FIVE_MINUTES)
    split = max(start, min(end, done)) if done else start
    acc: dict[int, dict] = defaultdict(lambda: defaultdict(float))

    def add(sid, *figures):
        _add(acc[sid], *figures)

    if split > start:
        rollups = (
            Rollup5m.objects.filter(series_id__in=series_ids, bucket__gte=floor(start, BUCKET["5m"]), bucket__lt=split)
            .values("series_id")
            .annotate(
                n=Sum("samples"),
                sm_n=_counted("sm_active_avg"),
                sm_w=_weighted("sm_active_avg"),
                sm_max=Max("sm_active_max"),
                util_n=_counted("gpu_util_avg"),
                util_w=_weighted("gpu_util_avg"),
                mem_max=Max("mem_used_mib_max"),
                power_n=_counted("power_w_avg"),
                power_w=_weighted("power_w_avg"),
            )
            .order_by("series_id")
        )
        for r in rollups:
            add(
                r["series_id"],
                r["n"],
                r["sm_n"],
                r["sm_w"] / r["sm_n"] if r["sm_n"] else None,
                r["sm_max"],
                r["util_n"],
                r["util_w"] / r["util_n"] if r["util_n"] else None,
                r["mem_max"],
                r["power_n"],
                r["power_w"] / r["power_n"] if r["power_n"] else None,
            )
    if split < end:
        samples, params = backends.samples_sql(
            series_ids, split, end, ("sm_active", "gpu_util", "mem_used_mib", "power_w")
        )
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH s AS MATERIALIZED ({samples}) SELECT series_id, count(*), "
                "count(sm_active), avg(sm_active), max(sm_active), count(gpu_util), avg(gpu_util), "
                "max(mem_used_mib), count(power_w), avg(power_w) FROM s GROUP BY series_id",
                params,
            )
            for row in cursor.fetchall():
                add(*(plain_number(v) for v in row))
    return {sid: _stats(acc.get(sid)) for sid in series_ids}


def _add(a: dict, n, sm_n, sm_avg, sm_max, util_n, util_avg, mem_max, power_n, power_avg) -> None:
    """Fold one rollup row or one group of raw samples into a series' running aggregates."""
    a["n"] += n or 0
    for key, count, avg in (("sm", sm_n, sm_avg), ("util", util_n, util_avg), ("power", power_n, power_avg)):
        if avg is not None and count:
            a[f"{key}_sum"] += avg * count
            a[f"{key}_n"] += count
    if sm_max is not None:
        a["sm_max"] = max(a.get("sm_max", sm_max), sm_max)
    if mem_max is not None:
        a["mem_max"] = max(a.get("mem_max", mem_max), mem_max)


def _stats(a: dict | None) -> Stats:
    if not a:
        return Stats()
    return Stats(
        samples=int(a["n"]),
        sm_active_avg=a["sm_sum"] / a["sm_n"] if a.get("sm_n") else None,
        sm_active_max=a.get("sm_max"),
        gpu_util_avg=a["util_sum"] / a["util_n"] if a.get("util_n") else None,
        mem_used_max=int(a["mem_max"]) if a.get("mem_max") is not None else None,
        power_w_avg=a["power_sum"] / a["power_n"] if a.get("power_n") else None,
    )


def windows_stats(windows: dict) -> dict:
    """window_stats for many (series id, start, end) windows at once, keyed as given: a constant number of reads.

    The 5-minute rollups of all the windows' series over their union come back in one read (per chunk of
    series) and the raw samples after the last finished rollup in one more; each window then takes the rollup
    buckets from floor(start) up to the finished point and the raw samples after it, as window_stats does.
    """
    windows = {key: w for key, w in windows.items() if w[2] > w[1]}
    if not windows:
        return {}
    series_ids = sorted({sid for sid, _, _ in windows.values()})
    done = RollupRun.finished_until(RollupLevel.FIVE_MINUTES)
    splits = {key: max(lo, min(hi, done)) if done else lo for key, (_, lo, hi) in windows.items()}
    by_series: dict[int, list] = defaultdict(list)
    for key, (sid, _, _) in windows.items():
        by_series[sid].append(key)
    acc: dict = defaultdict(lambda: defaultdict(float))
    rolled = [key for key, (_, lo, _) in windows.items() if splits[key] > lo]
    if rolled:
        lo_all = floor(min(windows[k][1] for k in rolled), BUCKET["5m"])
        hi_all = max(splits[k] for k in rolled)
        fields = ("series_id", "bucket", "samples", "sm_active_avg", "sm_active_max", "gpu_util_avg")
        fields += ("mem_used_mib_max", "power_w_avg")
        for chunk in _chunks(series_ids):
            rows = Rollup5m.objects.filter(series_id__in=chunk, bucket__gte=lo_all, bucket__lt=hi_all)
            for sid, bucket, n, sm_avg, sm_max, util_avg, mem_max, power_avg in rows.values_list(*fields):
                for key in by_series[sid]:
                    if floor(windows[key][1], BUCKET["5m"]) <= bucket < splits[key]:
                        counts = [n if v is not None else 0 for v in (sm_avg, util_avg, power_avg)]
                        _add(acc[key], n, counts[0], sm_avg, sm_max, counts[1], util_avg, mem_max, counts[2], power_avg)
    raw = [key for key, (_, _, hi) in windows.items() if hi > splits[key]]
    if raw:
        lo_all, hi_all = min(splits[k] for k in raw), max(windows[k][2] for k in raw)
        for sid, ts, sm, util, mem, power in sample_rows(
            series_ids, lo_all, hi_all, ("sm_active", "gpu_util", "mem_used_mib", "power_w")
        ):
            sm, util, mem, power = (plain_number(v) for v in (sm, util, mem, power))
            for key in by_series[sid]:
                if splits[key] <= ts < windows[key][2]:
                    ones = [1 if v is not None else 0 for v in (sm, util, power)]
                    _add(acc[key], 1, ones[0], sm, sm, ones[1], util, mem, ones[2], power)
    return {key: _stats(acc.get(key)) for key in windows}


def _counted(field: str):
    """Samples behind the rollup rows where `field` is present: the denominator of a weighted average."""
    return Sum("samples", filter=Q(**{f"{field}__isnull": False}))


def _weighted(field: str):
    """sum(avg x samples) over rollup rows where `field` is present: the numerator of a weighted average."""
    return Sum(Cast(F(field), FloatField()) * F("samples"), filter=Q(**{f"{field}__isnull": False}))


def latest_samples(series_ids: list[int], *, since: datetime) -> dict[int, Sample]:
    """The newest sample of each series since `since`."""
    if not series_ids:
        return {}
    return backends.latest_samples(series_ids, since=since)


def allocation_series(allocations) -> dict[int, int]:
    """allocation id -> series id, for MIG, full-GPU and vGPU allocations (time-slice units have no own series).

    A vGPU allocation is quota on its type's resource in the project's namespace, not one mdev device: it is
    paired with a vGPU series of its type whose VM (at the last poll) is the project's, one series per
    allocation, the allocation's own GPU first (vgpu_series)."""
    allocations = list(allocations)
    mig_ids = [a.mig_instance_id for a in allocations if a.kind == SpecKind.MIG and a.mig_instance_id]
    gpu_ids = [a.gpu_id for a in allocations if a.kind == SpecKind.FULL]
    by_mig, by_gpu = {}, {}
    for chunk in _chunks(mig_ids):
        by_mig.update(Series.objects.filter(mig_instance_id__in=chunk).values_list("mig_instance_id", "id"))
    for chunk in _chunks(gpu_ids):
        by_gpu.update(Series.objects.gpus().filter(gpu_id__in=chunk).values_list("gpu_id", "id"))
    result = vgpu_series([a for a in allocations if a.kind == SpecKind.VGPU])
    for a in allocations:
        sid = by_mig.get(a.mig_instance_id) if a.kind == SpecKind.MIG else by_gpu.get(a.gpu_id)
        if a.kind in (SpecKind.MIG, SpecKind.FULL) and sid is not None:
            result[a.pk] = sid
    return result


def vgpu_series(allocations) -> dict[int, int]:
    """vGPU allocation id -> the series of a vGPU its project's VM holds, of the allocation's type: one query.
    Allocations and series are paired per (project, type): those on the same GPU first, then in order."""
    if not allocations:
        return {}
    rows = (
        Series.objects.vgpus()
        .filter(
            vgpu_workload__project_id__in=sorted({a.project_id for a in allocations}),
            vgpu_type__in=sorted({a.profile_name for a in allocations}),
        )
        .values_list("pk", "gpu_id", "vgpu_type", "vgpu_workload__project_id")
        .order_by("gpu_id", "vgpu_uuid")
    )
    free: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for pk, gpu_id, vgpu_type, project_id in rows:
        free[(project_id, vgpu_type)].append((gpu_id, pk))
    result: dict[int, int] = {}
    ordered = sorted(allocations, key=lambda a: (a.gpu_id, a.replica, a.pk))
    for same_gpu in (True, False):
        for a in ordered:
            left = free.get((a.project_id, a.profile_name), [])
            if a.pk in result or not left:
                continue
            match = next((item for item in left if item[0] == a.gpu_id), None) if same_gpu else left[0]
            if match is not None:
                left.remove(match)
                result[a.pk] = match[1]
    return result


def pool_utilisation(pool, start: datetime, end: datetime, *, step: str) -> dict:
    """A pool's SM activity over time: per step, the compute-slice-weighted average of its units.

    Units are the pool's allocations that overlap the range, each counted only inside its own
    allocation window. Also returns the range average and the units behind it. On PostgreSQL the
    weighting happens in SQL (one row per step comes back); elsewhere in Python.
    """
    allocations = list(
        Allocation.objects.filter(pool=pool, allocated_at__lt=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=start))
        .order_by("pk")
    )
    series = allocation_series(allocations)
    units = [
        (series[a.pk], a.compute_slices or 1, a.allocated_at, a.released_at) for a in allocations if a.pk in series
    ]
    steps = backends.pool_steps(units, start, end, step)
    weighted = sum(avg * weight for _, avg, _, weight in steps)
    slices = sum(weight for *_, weight in steps)
    return {
        "units": sum(1 for a in allocations if a.released_at is None),
        "measured_units": len({sid for sid, *_ in units}),
        "sm_active_avg": weighted / slices if slices else None,
        "points": [{"ts": ts, "sm_active": avg, "units": n} for ts, avg, n, _ in steps],
    }


POOL_PODS_MAX = 50


def pool_pods(pool, start: datetime, end: datetime, *, limit: int = POOL_PODS_MAX) -> list[dict]:
    """Which of the project's pods used which of the pool's units over [start, end), and how hard.

    A pod's units are its devices as the kubelet listed them (WorkloadProfile.device_ids, every device of the
    pod) that the pool held; "how hard" is each unit's SM activity and memory over the part of the range when
    both the pod ran and the pool held the unit (window_stats: rollups plus the raw tail). Time-slice replicas
    share their GPU's series, which is operator-only: they are listed without figures. Newest pods first, at
    most `limit`; a constant number of reads whatever the number of pods (windows_stats).
    """
    allocations = list(
        Allocation.objects.filter(pool=pool, allocated_at__lt=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=start))
        .select_related("gpu", "mig_instance")
        .order_by("pk")
    )
    series = allocation_series(allocations)
    units: dict[str, Allocation] = {}
    for allocation in allocations:
        uuid = allocation.mig_instance.uuid if allocation.kind == SpecKind.MIG else allocation.gpu.uuid
        units.setdefault(uuid, allocation)
    workloads = (
        WorkloadProfile.objects.filter(project_id=pool.project_id, started_at__lt=end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=start))
        .order_by("-started_at", "pk")
    )
    found = []
    for workload in workloads.iterator(chunk_size=200):
        held = [units[uuid] for uuid in dict.fromkeys(physical_id(d) for d in workload.device_ids) if uuid in units]
        if not held:
            continue
        found.append((workload, held))
        if len(found) >= limit:
            break
    windows = {}
    for workload, held in found:
        for allocation in held:
            if series.get(allocation.pk) is not None:
                lo = max(start, workload.started_at, allocation.allocated_at)
                hi = min(end, workload.ended_at or end, allocation.released_at or end)
                windows[(workload.pk, allocation.pk)] = (series[allocation.pk], lo, hi)
    stats = windows_stats(windows)
    return [
        {
            "namespace": workload.namespace,
            "pod": workload.pod_name,
            "resource": workload.resource_name,
            "started_at": workload.started_at,
            "ended_at": workload.ended_at,
            "units": [_pod_unit(a, stats.get((workload.pk, a.pk))) for a in held],
        }
        for workload, held in found
    ]


def _pod_unit(allocation: Allocation, stats: Stats | None) -> dict:
    return {
        "allocation": allocation.pk,
        "kind": allocation.kind,
        "uuid": allocation.mig_instance.uuid if allocation.kind == SpecKind.MIG else allocation.gpu.uuid,
        "sm_active_avg": stats.sm_active_avg if stats else None,
        "sm_active_max": stats.sm_active_max if stats else None,
        "mem_used_max_mib": stats.mem_used_max if stats else None,
    }
