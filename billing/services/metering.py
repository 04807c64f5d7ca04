"""Hourly metering: each UTC hour of an allocation becomes one UsageRecord holding the seconds its clock ran.

- Nothing is metered for a pool until its provisioning has completed (GpuPool.provisioned_at, or
  an active pool); then the clock starts at Allocation.allocated_at (set by the approval): the
  hours since approval are backfilled. A pool whose provisioning never completes is never billed.
- The rate is the card in force at the start of each hour (PriceBook).
- Hours are claimed one at a time through the MeteringWatermark row, so metering catches up after
  any downtime and two workers never meter the same hour.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, Min, OuterRef, Q
from django.utils import timezone

from capacity.mig.share import shares_per_gpu
from core.leases import crash_point
from pools.choices import PoolState, RequestState
from pools.models import Allocation, PoolRequestTransition
from pricing.rates import spec_fields, spec_key
from pricing.services import PriceBook

from .. import backends, measurements
from ..choices import ALLOCATION_COLUMNS, METERED_COLUMNS
from ..models import MeteringWatermark, UsageRecord
from ..periods import HOUR, floor_hour
from .clock import Unit, failed_windows, health_windows, hour_figures, units_of
from .credits import refresh_credits, refresh_measurements
from .intervals import Interval

# An allocation created late (allocated_at backdated to its approval), or whose pool finished
# provisioning late, is backfilled when it has no record yet and started (or finished provisioning)
# at most this long before the hour being metered.
LATE_ALLOCATION_WINDOW = timedelta(days=31)

RECORD_COLUMNS = (
    "allocation_id",
    "hour",
    "project_id",
    "pool_id",
    *METERED_COLUMNS,
    "rate_card_id",
    "sm_activity",
    "energy_kwh",
)


def _records_for(units_hours: list[tuple[Unit, datetime]], book: PriceBook, until: datetime) -> list[tuple]:
    """Rows (RECORD_COLUMNS order) for each (allocation, hour) in which the clock ran."""
    if not units_hours:
        return []
    units = list({u.id: u for u, _ in units_hours}.values())
    first = min(h for _, h in units_hours)
    failed = failed_windows(units, until)
    health = health_windows(units, first, until)
    final = measurements.final_until()
    by_hour: dict[datetime, list[Unit]] = defaultdict(list)
    for unit, hour in units_hours:
        by_hour[hour].append(unit)
    rows = []
    no_windows: list[Interval] = []
    for hour, hour_units in sorted(by_hour.items()):
        card = book.card_at(hour)
        card_id = card.pk if card else None
        figures = {
            u.id: hour_figures(u, hour, failed.get(u.request_id, no_windows), health.get(u.id, no_windows))
            for u in hour_units
        }
        billed = [u for u in hour_units if figures[u.id].seconds > 0]
        measured = {}
        if final is not None and hour < final:
            measured = measurements.measured_use(
                [
                    measurements.MeteredUnit(
                        u.id, u.gpu_id, u.mig_instance_id, u.kind, u.share(), figures[u.id].seconds
                    )
                    for u in billed
                ],
                hour,
            )
        for unit in billed:
            spec, f, m = unit.spec, figures[unit.id], measured.get(unit.id)
            rows.append(
                (
                    unit.id,
                    hour,
                    unit.project_id,
                    unit.pool_id,
                    spec.kind,
                    spec.product,
                    spec.profile_name,
                    spec.replicas,
                    f.seconds,
                    f.failed,
                    f.health,
                    book.price(card, spec, unit.compute_slices, hour),
                    card_id,
                    m.sm_activity if m else None,
                    m.energy_kwh if m else None,
                )
            )
    return rows


def insert_records(rows: list[tuple]) -> None:
    """INSERT ... ON CONFLICT (allocation, hour) DO NOTHING: a row already metered is never written twice.

    Rows are in RECORD_COLUMNS order; billing.backends writes them in one statement per chunk.
    """
    if rows:
        backends.insert_usage_records(RECORD_COLUMNS, rows)


# Billing waits for provisioning: a pool is metered once its provisioning has completed
# (provisioned_at set; an active pool has completed it too), then from approval (allocated_at).
# A pool still provisioning (a worker died mid-way) or whose provisioning failed and never
# completed is never metered.
PROVISIONED = Q(pool__provisioned_at__isnull=False) | Q(pool__state=PoolState.ACTIVE)


def meter_hour(hour: datetime, *, book: PriceBook | None = None, in_sql: bool | None = None) -> int:
    """Write the UsageRecords of one UTC hour; returns the rows offered for insert.

    Covers every allocation of a provisioned pool (PROVISIONED) whose clock ran in
    [hour, hour + 1 h), plus allocations that have no record at all yet although they started before
    `hour` (created late with a backdated allocated_at, or whose provisioning completed only now):
    those are backfilled from their first hour, i.e. from approval. Idempotent: rows go in with
    INSERT ... ON CONFLICT DO NOTHING on (allocation, hour), so a retry or a concurrent run adds
    nothing twice. Takes no locks itself; meter_usage serialises hours through the watermark.

    `in_sql` (default: where the database can, billing.backends.meter_plain_hour, and the hour's rollups
    are not final yet, which is the usual case: metering runs minutes after the hour, monitoring finalises
    it later and catch_up_measurements fills the showback then): the hour's running allocations that no
    credit can touch are metered by one INSERT ... SELECT (_meter_plain); the others, and the late ones,
    go through Python (Unit, hour_figures) as always. Both give the same rows
    (tests/billing/test_billing_metering_in_sql.py).
    """
    book = book or PriceBook()
    end = hour + HOUR
    running = (
        Allocation.objects.filter(PROVISIONED, allocated_at__lt=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=hour))
        .filter(Q(pool__request__end_at__isnull=True) | Q(pool__request__end_at__gt=hour))
    )
    recent = hour - LATE_ALLOCATION_WINDOW
    late = (
        Allocation.objects.filter(PROVISIONED, allocated_at__lt=hour)
        .filter(Q(allocated_at__gte=recent) | Q(pool__provisioned_at__gte=recent))
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=F("allocated_at")))
        .filter(~Exists(UsageRecord.objects.filter(allocation=OuterRef("pk"))))
    )
    late_units = units_of(late)  # before this hour's rows go in: "no record yet" is read first
    if in_sql is None:
        final = measurements.final_until()
        in_sql = backends.METERS_IN_SQL and (final is None or hour >= final)
    offered = 0
    if in_sql:
        credited = _may_be_credited(hour, end)
        offered = _meter_plain(running.exclude(credited), hour, end, book)
        running = running.filter(credited)
    units_hours = [(u, hour) for u in units_of(running) if u.clock(hour, end)]
    seen = {(u.id, h) for u, h in units_hours}
    for unit in late_units:
        units_hours.extend((unit, h) for h in unit.hours(hour) if (unit.id, h) not in seen)
    rows = _records_for(units_hours, book, end)
    insert_records(rows)
    return offered + len(rows)


def _may_be_credited(hour: datetime, end: datetime) -> Q:
    """Allocations a failed-provisioning or health credit may touch in [hour, end): their request or pool
    failed now or their request ever failed (failed_windows), or their GPU has a critical health event
    in the hour (health_windows). A superset: hour_figures decides the credit of each."""
    ever_failed = PoolRequestTransition.objects.filter(to_state=RequestState.FAILED, at__lt=end).values("request_id")
    credited = (
        Q(pool__request__state=RequestState.FAILED)
        | Q(pool__state=PoolState.FAILED)
        | Q(pool__request_id__in=ever_failed)
    )
    sick = sorted({gpu_id for gpu_id, _ in measurements.critical_health_windows(None, hour, end)})
    return credited | Q(gpu_id__in=sick) if sick else credited


def _meter_plain(allocations, hour: datetime, end: datetime, book: PriceBook) -> int:
    """Meter `hour` for `allocations` (none of them credited, no measurements) in SQL; returns the rows offered.

    The same rows as _records_for: the clock clipped to the hour in whole seconds, the spec and rate of each
    distinct (kind, product, profile, node replicas, compute slices) priced here by the PriceBook."""
    card = book.card_at(hour)
    rows = allocations.order_by().values_list(
        *ALLOCATION_COLUMNS,
        "gpu__node__timeslice_replicas",
        "allocated_at",
        "released_at",
        "pool__request__end_at",
    )
    sql, params = rows.query.sql_with_params()

    def price(specs: list[tuple]) -> list[tuple]:
        priced = []
        for kind, product, profile_name, node_replicas, compute_slices in specs:
            spec = spec_key(kind, product, profile_name, shares_per_gpu(kind, profile_name, node_replicas))
            rate = book.price(card, spec, compute_slices, hour)
            priced.append(
                (kind, product, profile_name, node_replicas, compute_slices, *spec_fields(spec).values(), rate)
            )
        return priced

    return backends.meter_plain_hour(sql, params, hour, end, price, card.pk if card else None)


def _watermark_start() -> datetime:
    first = Allocation.objects.aggregate(first=Min("allocated_at"))["first"]
    return floor_hour(first or timezone.now())


def watermark() -> MeteringWatermark:
    try:
        return MeteringWatermark.objects.get(pk=1)
    except MeteringWatermark.DoesNotExist:
        pass
    try:
        with transaction.atomic():
            return MeteringWatermark.objects.create(pk=1, metered_until=_watermark_start())
    except IntegrityError:  # another worker created it first
        return MeteringWatermark.objects.get(pk=1)


@dataclass
class MeterResult:
    hours: int = 0
    records: int = 0
    metered_until: datetime | None = None
    hours_done: list[datetime] = field(default_factory=list)


def meter_usage(*, now: datetime | None = None, until: datetime | None = None) -> MeterResult:
    """Meter every complete UTC hour from the watermark up to `until` (default: the start of the current hour).

    Catches up after any downtime, hour by hour. Each hour is claimed with a conditional UPDATE of
    the watermark row (metered_until = H -> H + 1 h, must touch one row) in the same transaction as
    its inserts: two workers never meter the same hour, a crash rolls the claim back, and the
    (allocation, hour) unique constraint backs this up. Then refreshes credits and showback for
    the open period. Safe to run at any time, any number of times at once.
    """
    now = now or timezone.now()
    limit = floor_hour(until or now)
    result = MeterResult()
    book = PriceBook()
    watermark()
    while True:
        current = MeteringWatermark.objects.values_list("metered_until", flat=True).get(pk=1)
        if current + HOUR > limit:
            result.metered_until = current
            break
        with transaction.atomic():
            claimed = MeteringWatermark.objects.filter(pk=1, metered_until=current).update(
                metered_until=current + HOUR, updated_at=timezone.now()
            )
            if not claimed:  # another worker claimed this hour first (the UPDATE of row 1 touched none)
                continue
            result.records += meter_hour(current, book=book)
            crash_point("metering.hour")  # fault suite: rows inserted, the hour's transaction not committed
        result.hours += 1
        result.hours_done.append(current)
    if result.hours:
        lookback = max(result.metered_until - timedelta(hours=settings.BILLING_REFRESH_HOURS), result.hours_done[0])
        refresh_credits(lookback, result.metered_until)
    catch_up_measurements()
    return result


def catch_up_measurements(*, max_hours: int | None = None) -> int:
    """Measure every metered hour whose rollups became final since the last pass; returns rows filled.

    Progress is MeteringWatermark.measured_until (hours before it had their final rollups applied),
    so each hour is looked at once after monitoring finalised it, at most `max_hours` per call
    (default BILLING_REFRESH_HOURS). Idempotent; two workers at once only repeat harmless work.
    """
    final = measurements.final_until()
    if final is None:
        return 0
    mark = watermark()
    upto = min(floor_hour(final), mark.metered_until)
    max_hours = max_hours or settings.BILLING_REFRESH_HOURS
    start = mark.measured_until or upto - max_hours * HOUR
    if start >= upto:
        return 0
    stop = min(upto, start + max_hours * HOUR)
    filled = refresh_measurements(start, stop)
    MeteringWatermark.objects.filter(pk=1, measured_until=mark.measured_until).update(measured_until=stop)
    return filled
