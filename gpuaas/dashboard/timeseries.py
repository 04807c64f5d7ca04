"""The dashboard's time series from monitoring's 5-minute rollups: per cluster, per GPU and per pool (with its pods)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from fractions import Fraction

from django.db.models import Avg, Q, Sum
from django.utils import timezone

from capacity.mig.share import unit_share
from capacity.models import Cluster
from monitoring import readers
from monitoring.models import Rollup5m, Series
from pools.models import Allocation

from .sources import rounded, unavailable

SERIES_WINDOW = timedelta(hours=3)
BUCKET = timedelta(minutes=5)

# The metrics the charts draw, as the JSON names them; "max" fixes the y axis where it is a percentage.
POWER = {"key": "power_w", "label": "Power", "unit": "W"}
SM_ACTIVITY = {"key": "sm_active_pct", "label": "SM activity", "unit": "%", "max": 100}
UTILISATION = {"key": "gpu_util_pct", "label": "Utilisation", "unit": "%", "max": 100}
TEMPERATURE = {"key": "temperature_c", "label": "Temperature", "unit": "°C"}


def _since():
    return timezone.now() - SERIES_WINDOW


def _panel(per: str, metrics: list[dict], series: list[dict], note: str = "") -> dict:
    """A chart panel over the window: every chart's time axis spans `from`..`to`, so a metric whose
    readings begin later is drawn where they begin, and the summary says when that is."""
    if not any(line["points"] for line in series):
        return unavailable("No metrics recorded in the last 3 hours yet.")
    now = timezone.now()
    summary = "5-minute averages over the last 3 hours (UTC)." + (f" {note}" if note else "")
    late = _late_metrics(metrics, series)
    if late:
        summary += " " + " ".join(f"{label} readings begin at {at:%H:%M}." for label, at in late)
    return {
        "available": True,
        "per": per,
        "metrics": metrics,
        "series": series,
        "summary": summary,
        "from": (now - SERIES_WINDOW).isoformat(),
        "to": now.isoformat(),
    }


def _late_metrics(metrics: list[dict], series: list[dict]) -> list[tuple[str, datetime]]:
    """(label, first reading) of each metric whose first reading comes after the panel's first bucket."""
    first: dict[str, datetime] = {}
    for line in series:
        for point in line["points"]:
            for metric in metrics:
                if point.get(metric["key"]) is not None:
                    at = datetime.fromisoformat(point["t"])
                    first[metric["key"]] = min(first.get(metric["key"], at), at)
    if not first:
        return []
    start = min(first.values())
    return [(m["label"], first[m["key"]]) for m in metrics if m["key"] in first and first[m["key"]] > start]


def cluster_series(clusters: list[Cluster]) -> dict:
    """Per cluster and 5-minute bucket: total GPU power, mean SM activity and mean utilisation. One query.

    SM activity averages every GPU- and MIG-level series that reports it; power and utilisation come
    from the GPU-level series (DCGM and NVML report power per GPU; utilisation is not reported on
    MIG-enabled GPUs).
    """
    names = {c.pk: c.name for c in clusters}
    gpu_level = Q(series__mig_instance__isnull=True, series__vgpu_uuid="")  # a vGPU is not a GPU
    rows = (
        Rollup5m.objects.filter(bucket__gte=_since(), series__gpu__node__cluster_id__in=list(names))
        .values("series__gpu__node__cluster_id", "bucket")
        .annotate(
            power=Sum("power_w_avg", filter=gpu_level),
            sm=Avg("sm_active_avg"),
            util=Avg("gpu_util_avg", filter=gpu_level),
        )
        .order_by("series__gpu__node__cluster_id", "bucket")
    )
    points: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        points[row["series__gpu__node__cluster_id"]].append(
            {
                "t": row["bucket"].isoformat(),
                "power_w": rounded(row["power"], 0),
                "sm_active_pct": rounded(row["sm"]),
                "gpu_util_pct": rounded(row["util"]),
            }
        )
    series = [{"label": names[pk], "cluster_id": pk, "points": points[pk]} for pk in names]
    return _panel("cluster", [SM_ACTIVITY, POWER, UTILISATION], series, "Power is the cluster's total.")


def cluster_activity(series_panel: dict) -> dict:
    """{cluster_id: {"sm_active_pct", "power_w", "at"}}: each cluster's latest 5-minute bucket."""
    if not series_panel.get("available"):
        return {}
    activity = {}
    for line in series_panel["series"]:
        if line["points"]:
            last = line["points"][-1]
            activity[line["cluster_id"]] = {
                "sm_active_pct": last["sm_active_pct"],
                "power_w": last["power_w"],
                "at": last["t"],
            }
    return activity


def _point(ts, values: dict) -> dict:
    """A chart point from a monitoring reader's point (metric names as Sample's columns)."""
    return {
        "t": ts.isoformat(),
        "power_w": rounded(values.get("power_w"), 0),
        "sm_active_pct": rounded(values.get("sm_active")),
        "gpu_util_pct": rounded(values.get("gpu_util")),
        "temperature_c": rounded(values.get("temp_c")),
    }


def gpu_series(gpu) -> dict:
    """One line per series of the GPU: the GPU itself, each of its MIG instances or vGPUs. Three queries.

    Read with monitoring.readers.series_points at the 5-minute step: finished rollups, then the
    samples of the bucket still open, so the chart is never a rollup period behind.
    """
    series = list(
        Series.objects.filter(gpu=gpu)
        .values("id", "mig_instance_id", "mig_instance__profile__name", "mig_instance__placement_start", "vgpu_type")
        .order_by("mig_instance__placement_start", "id")
    )
    now = timezone.now()
    points = readers.series_points(
        [s["id"] for s in series],
        now - SERIES_WINDOW,
        now,
        step="5m",
        metrics=("power_w", "sm_active", "gpu_util", "temp_c"),
    )
    lines = [
        {
            "label": (
                f"{s['mig_instance__profile__name']} @{s['mig_instance__placement_start']}"
                if s["mig_instance_id"]
                else (f"vGPU {s['vgpu_type']}" if s["vgpu_type"] else f"GPU {gpu.index}")
            ),
            "points": [_point(p["ts"], p) for p in points.get(s["id"], [])],
        }
        for s in series
    ]
    return _panel("series", [SM_ACTIVITY, POWER, UTILISATION, TEMPERATURE], lines)


def _unit_share(allocation) -> Fraction:
    return unit_share(
        allocation.kind,
        allocation.product,
        allocation.profile_name,
        compute_slices=allocation.compute_slices,
        replicas=allocation.gpu.node.timeslice_replicas,
    )


def _held_through(bucket, held) -> bool:
    """Whether the 5-minute bucket lies wholly inside the holding window (a hand-over bucket is left out)."""
    held_from, held_until = held
    return bucket >= held_from and (held_until is None or bucket + BUCKET <= held_until)


def pool_pods(pool) -> list[dict]:
    """Which of the project's pods used which of the pool's units over the series window, and how hard.

    monitoring.readers.pool_pods, the same rows the monitoring API's pool detail gives as "pods": only the
    pool's project's pods, a constant number of queries whatever their number.
    """
    now = timezone.now()
    return readers.pool_pods(pool, now - SERIES_WINDOW, now)


def pool_series(pool) -> dict:
    """The pool's SM activity and power per 5-minute bucket over the last 3 hours. A handful of queries.

    SM activity is monitoring's pool utilisation (monitoring.readers.pool_utilisation): the
    compute-slice-weighted mean of the pool's MIG and full-GPU units, each counted only while the
    pool held it; the same figure the monitoring API gives. Power is each unit's GPU power times the
    unit's share of that GPU (capacity.mig.share.unit_share), summed over the
    units while held, which is how billing attributes energy (DCGM reports power per GPU only).
    """
    now = timezone.now()
    start = now - SERIES_WINDOW
    allocations = list(
        Allocation.objects.filter(pool=pool, allocated_at__lt=now)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=start))
        .select_related("gpu__node")
        .order_by("pk")
    )
    if not allocations:
        return unavailable("The pool holds no units yet.")
    sm = {p["ts"]: p["sm_active"] for p in readers.pool_utilisation(pool, start, now, step="5m")["points"]}
    gpu_series_ids = dict(
        Series.objects.gpus().filter(gpu_id__in={a.gpu_id for a in allocations}).values_list("gpu_id", "id")
    )
    windows: dict[int, list] = defaultdict(list)
    for allocation in allocations:
        if allocation.gpu_id in gpu_series_ids:
            windows[gpu_series_ids[allocation.gpu_id]].append((allocation.allocated_at, allocation.released_at))
    power_points = readers.series_points(list(windows), start, now, step="5m", metrics=("power_w",))
    power: dict = defaultdict(Fraction)
    for allocation in allocations:
        series_id = gpu_series_ids.get(allocation.gpu_id)
        held = (allocation.allocated_at, allocation.released_at)
        for point in power_points.get(series_id, []):
            if point["power_w"] is not None and _held_through(point["ts"], held):
                power[point["ts"]] += Fraction(point["power_w"]) * _unit_share(allocation)
    points = [
        {
            "t": ts.isoformat(),
            "sm_active_pct": rounded(sm.get(ts)),
            "power_w": rounded(power[ts], 0) if ts in power else None,
        }
        for ts in sorted(set(sm) | set(power))
    ]
    note = "Power is attributed by each unit's share of its GPU, as billing attributes energy."
    return _panel("pool", [SM_ACTIVITY, POWER], [{"label": pool.name, "points": points}], note)
