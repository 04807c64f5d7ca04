"""The seam between billing and monitoring: what was measured, and when a unit was critically unhealthy.

Billing reads monitoring's tables here and nowhere else, through two functions (tests replace them
to exercise the callers):

- measured_use(units, hour) -> {allocation_id: Measured}
    From monitoring.Rollup1h, final buckets only (bucket < RollupRun("1h").complete_until).
    SM activity: the average over the hour of the unit's own series, as a fraction 0..1: the MIG
    instance's series for a MIG unit; the GPU's series for a full GPU or a time-slice replica
    (time-slicing has no per-replica counter, so every replica shows the GPU's activity).
    Energy (kWh): the GPU series' average power (W) x the seconds the clock ran / 3,600,000, times
    the unit's share of the GPU for MIG and time-slice units (power is reported per GPU only); the
    energy counter's delta (mJ) is used when the bucket has no average power.
    A unit with no final rollup for the hour is left out: its record stays NULL ("not measured").
    A trespasser's time is not the owner's use: while a foreign pod ran on the unit (monitoring's
    TrespassEvent), that share of the hour is taken out of the SM activity (the trespasser pays the
    list rate for it instead, billing.services.lines.event_lines). The activity within the hour is
    taken as even: hourly rollups cannot say which minutes were whose.

- trespasses(start, end, project_ids or None) -> monitoring.TrespassEvent queryset
    Trespass events with a known offending project overlapping [start, end): what the trespasser pays.

- critical_health_windows(gpu_ids or None, start, end) -> {(gpu_id, mig_instance_id or None): [(from, to)]}
    From monitoring.HealthEvent, level critical, open at some point in [start, end): from opened_at
    to resolved_at (to `end` while still open). A GPU-level event (no MIG instance) withholds every
    unit on that GPU; a MIG-level event only the unit holding that instance (see windows_for()).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from django.db.models import Q

from monitoring.choices import HealthLevel, RollupLevel
from monitoring.models import HealthEvent, Rollup1h, RollupRun, Series, TrespassEvent
from monitoring.services.trespass import foreign_seconds

HOUR = timedelta(hours=1)
SM_PLACES = Decimal("0.0001")
KWH_PLACES = Decimal("0.000001")


@dataclass(frozen=True)
class MeteredUnit:
    allocation_id: int
    gpu_id: int
    mig_instance_id: int | None
    kind: str
    share: Fraction  # of the physical GPU: 1 full, max(compute, memory share) MIG, 1/replicas time-slice
    seconds: int = 3600  # how long the clock ran in the hour


@dataclass(frozen=True)
class Measured:
    sm_activity: Decimal | None  # 0..1
    energy_kwh: Decimal | None


HealthKey = tuple[int, int | None]


def final_until() -> datetime | None:
    """Hourly rollups of buckets before this instant are final (monitoring's RollupRun); None = none yet."""
    return RollupRun.objects.filter(level=RollupLevel.HOUR).values_list("complete_until", flat=True).first()


def measured_use(units: list[MeteredUnit], hour: datetime) -> dict[int, Measured]:
    """Average SM activity and energy of each unit over one hour, from monitoring's hourly rollups."""
    if not units:
        return {}
    final = final_until()
    if final is None or hour >= final:
        return {}
    gpu_ids = sorted({u.gpu_id for u in units})
    mig_ids = sorted({u.mig_instance_id for u in units if u.mig_instance_id})
    series_of_gpu: dict[int, int] = {}
    series_of_mig: dict[int, int] = {}
    wanted = Q(gpu_id__in=gpu_ids, mig_instance__isnull=True, vgpu_uuid="")  # the GPU, not its vGPUs
    if mig_ids:
        wanted |= Q(mig_instance_id__in=mig_ids)
    for series_id, gpu_id, mig_id in Series.objects.filter(wanted).values_list("id", "gpu_id", "mig_instance_id"):
        if mig_id is None:
            series_of_gpu[gpu_id] = series_id
        else:
            series_of_mig[mig_id] = series_id
    rollups = {
        row["series_id"]: row
        for row in Rollup1h.objects.filter(
            series_id__in=sorted(set(series_of_gpu.values()) | set(series_of_mig.values())), bucket=hour
        ).values("series_id", "sm_active_avg", "power_w_avg", "energy_mj_min", "energy_mj_max")
    }
    trespassed = _trespass_seconds(units, hour)
    result: dict[int, Measured] = {}
    for unit in units:
        gpu_rollup = rollups.get(series_of_gpu.get(unit.gpu_id))
        own = rollups.get(series_of_mig.get(unit.mig_instance_id)) if unit.mig_instance_id else gpu_rollup
        sm = own["sm_active_avg"] if own else None
        if sm is not None and trespassed.get(unit.allocation_id):
            sm *= max(0.0, 1 - trespassed[unit.allocation_id] / max(unit.seconds, 1))
        energy = _energy_kwh(gpu_rollup, unit) if gpu_rollup else None
        if sm is None and energy is None:
            continue
        result[unit.allocation_id] = Measured(
            sm_activity=None if sm is None else _fraction(sm),
            energy_kwh=energy,
        )
    return result


def _trespass_seconds(units: list[MeteredUnit], hour: datetime) -> dict[int, int]:
    """allocation id -> seconds of the hour a foreign pod ran on its unit (one query)."""
    return foreign_seconds({u.allocation_id: (u.gpu_id, u.mig_instance_id) for u in units}, hour, hour + HOUR)


def trespasses(start: datetime, end: datetime, project_ids: list[int] | None = None):
    """Trespass events with a known offending project, overlapping [start, end)."""
    events = TrespassEvent.objects.filter(project__isnull=False, started_at__lt=end).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=start)
    )
    if project_ids is not None:
        events = events.filter(project_id__in=project_ids)
    return events


def _fraction(percent: float) -> Decimal:
    value = Decimal(str(percent)) / 100
    return min(Decimal(1), max(Decimal(0), value)).quantize(SM_PLACES)


def _energy_kwh(rollup: dict, unit: MeteredUnit) -> Decimal | None:
    share = Decimal(unit.share.numerator) / Decimal(unit.share.denominator)
    if rollup["power_w_avg"] is not None:
        joules = Decimal(str(rollup["power_w_avg"])) * unit.seconds
    elif rollup["energy_mj_min"] is not None and rollup["energy_mj_max"] is not None:
        joules = Decimal(rollup["energy_mj_max"] - rollup["energy_mj_min"]) / 1000 * unit.seconds / 3600
    else:
        return None
    return (joules * share / Decimal(3_600_000)).quantize(KWH_PLACES)


def critical_health_windows(gpu_ids, start: datetime, end: datetime) -> dict[HealthKey, list]:
    """Critical health periods within [start, end) per (GPU, MIG instance or None), from monitoring.HealthEvent.

    `gpu_ids` narrows to those GPUs; None means every GPU (one small query: critical events are rare,
    so the meter asks for all of them rather than sending thousands of ids).
    """
    if gpu_ids is not None and not gpu_ids:
        return {}
    events = HealthEvent.objects.filter(level=HealthLevel.CRITICAL, opened_at__lt=end).filter(
        Q(resolved_at__isnull=True) | Q(resolved_at__gt=start)
    )
    if gpu_ids is not None:
        events = events.filter(gpu_id__in=list(gpu_ids))
    windows: dict[HealthKey, list] = defaultdict(list)
    for gpu_id, mig_id, opened, resolved in events.values_list(
        "gpu_id", "mig_instance_id", "opened_at", "resolved_at"
    ).order_by("gpu_id", "opened_at"):
        windows[(gpu_id, mig_id)].append((opened, resolved))
    return {key: clip_windows(value, start, end) for key, value in windows.items()}


def windows_for(windows: dict[HealthKey, list], gpu_id: int, mig_instance_id: int | None) -> list:
    """The critical periods that withhold one unit: its GPU's, plus its own MIG instance's."""
    found = list(windows.get((gpu_id, None), []))
    if mig_instance_id is not None:
        found += windows.get((gpu_id, mig_instance_id), [])
    return found


def clip_windows(
    windows: list[tuple[datetime, datetime | None]], start: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """Windows clipped to [start, end), open ends run to `end`; empty ones dropped, overlaps merged."""
    clipped = sorted((max(a, start), min(b or end, end)) for a, b in windows)
    merged: list[tuple[datetime, datetime]] = []
    for a, b in clipped:
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
