"""Credits and showback, recomputed for hours already metered while their period is still open.

Both can change after an hour was metered: a request fails or a retry succeeds, a health event is
recorded late, monitoring finalises an hour's rollups. Records already billed by a finalised
statement (billed_on set) are never touched.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import Q

from capacity.mig.share import unit_share
from pools.choices import PoolState, RequestState
from pools.models import Allocation, PoolRequestTransition

from .. import measurements
from ..models import UsageRecord
from .clock import failed_windows, health_windows, hour_figures, units_of


def refresh_credits(start: datetime, end: datetime, *, project_ids: list[int] | None = None) -> int:
    """Recompute failed-provisioning and health credits of records in [start, end); returns rows changed.

    Needed because both can change after an hour was metered: a request fails (credits its whole
    life), a retry succeeds (only the failed time stays credited), a health event is recorded late.
    Only touches allocations that are or were failed, sit on a GPU with a critical event in the
    period, or already carry a credit (a partial index finds those); never records already billed
    by a finalised statement (billed_on set). Idempotent.
    """
    allocations = Allocation.objects.filter(allocated_at__lt=end).filter(
        Q(released_at__isnull=True) | Q(released_at__gt=start)
    )
    if project_ids is not None:
        allocations = allocations.filter(project_id__in=project_ids)
    records = UsageRecord.objects.filter(hour__gte=start, hour__lt=end, billed_on__isnull=True)
    credited = records.filter(Q(failed_credit_seconds__gt=0) | Q(health_credit_seconds__gt=0))
    suspects = Q(pool__state=PoolState.FAILED) | Q(pool__request__state=RequestState.FAILED)
    suspects |= Q(
        pool__request_id__in=PoolRequestTransition.objects.filter(to_state=RequestState.FAILED).values("request_id")
    )
    suspects |= Q(pk__in=credited.values("allocation_id"))
    unhealthy = measurements.critical_health_windows(None, start, end)
    if unhealthy:
        suspects |= Q(gpu_id__in=sorted({gpu_id for gpu_id, _ in unhealthy}))
    units = {u.id: u for u in units_of(allocations.filter(suspects))}
    if not units:
        return 0
    failed = failed_windows(list(units.values()), end)
    health = health_windows(list(units.values()), start, end)
    changed = []
    for record in records.filter(allocation_id__in=list(units)).order_by("pk"):
        unit = units[record.allocation_id]
        figures = hour_figures(unit, record.hour, failed.get(unit.request_id, []), health.get(unit.id, []))
        failed_s = min(figures.failed, record.seconds)
        health_s = min(figures.health, record.seconds - failed_s)
        if (record.failed_credit_seconds, record.health_credit_seconds) != (failed_s, health_s):
            record.failed_credit_seconds, record.health_credit_seconds = failed_s, health_s
            changed.append(record)
    UsageRecord.objects.bulk_update(changed, ["failed_credit_seconds", "health_credit_seconds"], batch_size=1000)
    return len(changed)


def refresh_measurements(start: datetime, end: datetime) -> int:
    """Fill the showback fields of records in [start, end) that have none yet, from monitoring's final rollups.

    Monitoring rolls an hour up after it ends, often after that hour was metered. Never touches a
    record already billed by a finalised statement. Idempotent (only NULL fields are filled); returns the rows filled.
    """
    pending = (
        UsageRecord.objects.filter(
            hour__gte=start, hour__lt=end, sm_activity__isnull=True, energy_kwh__isnull=True, billed_on__isnull=True
        )
        .values(
            "pk",
            "allocation_id",
            "project_id",
            "hour",
            "kind",
            "product",
            "profile_name",
            "replicas",
            "seconds",
            "allocation__gpu_id",
            "allocation__mig_instance_id",
        )
        .order_by("hour", "pk")
    )
    by_hour: dict[datetime, list[dict]] = defaultdict(list)
    for row in pending:
        by_hour[row["hour"]].append(row)
    if not by_hour:
        return 0
    changed = []
    for hour, rows in sorted(by_hour.items()):
        units = [
            measurements.MeteredUnit(
                r["allocation_id"],
                r["allocation__gpu_id"],
                r["allocation__mig_instance_id"],
                r["kind"],
                unit_share(r["kind"], r["product"], r["profile_name"], replicas=r["replicas"]),
                r["seconds"],
            )
            for r in rows
        ]
        measured = measurements.measured_use(units, hour)
        for r in rows:
            m = measured.get(r["allocation_id"])
            if m is not None:
                changed.append(UsageRecord(pk=r["pk"], sm_activity=m.sm_activity, energy_kwh=m.energy_kwh))
    UsageRecord.objects.bulk_update(changed, ["sm_activity", "energy_kwh"], batch_size=1000)
    return len(changed)
