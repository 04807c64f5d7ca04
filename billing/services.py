"""Billing workflows: rate cards, hourly metering, credits, showback and monthly statements.

The rules (docs/billing.md has them in full):

- Nothing is metered for a pool until its provisioning has completed (GpuPool.provisioned_at, or
  an active pool); then the clock starts at Allocation.allocated_at (set by the approval): the
  hours since approval are backfilled. A pool whose provisioning never completes is never billed.
- The clock stops at the earlier of
  Allocation.released_at and the request's end_at (expiry). Each UTC hour of an allocation becomes
  one UsageRecord holding the whole seconds the clock ran in it.
- Provisioning failed: a request that has failed (request or pool state "failed") and never
  became active is not charged at all: all of its usage is credited (the project never got the
  capacity). If a retry later succeeds, the clock still runs from approval, and only the time
  from each failure to the retry that left "failed" (from the request's transitions) is credited.
- Units on a GPU with an open critical health event are credited for that time (not twice when
  also failed).
- The rate is the card in force at the start of each hour: prices change on hour boundaries.
- Amounts are never rounded before statement lines; each line is rounded once to cents.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import (
    DecimalField,
    Exists,
    ExpressionWrapper,
    F,
    IntegerField,
    Min,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, TruncMonth
from django.utils import timezone

from capacity.choices import SpecKind
from gpuaas.leases import crash_point
from pools.choices import PoolState, RequestState
from pools.models import Allocation, GpuPool, PoolRequestTransition
from tenancy.models import Project

from . import measurements, rates
from .choices import LineType, RunKind, RunStatus, StatementState
from .models import (
    CENTS,
    HOUR_S,
    LINE_ORDER,
    BillingRun,
    MeteringWatermark,
    MonthNotEnded,
    RateCard,
    RateCardEntry,
    Statement,
    StatementFinalised,
    StatementLine,
    UsageRecord,
)
from .periods import HOUR, floor_hour, month_bounds, month_start, next_month, previous_month

logger = logging.getLogger(__name__)

# An allocation created late (allocated_at backdated to its approval), or whose pool finished
# provisioning late, is backfilled when it has no record yet and started (or finished provisioning)
# at most this long before the hour being metered.
LATE_ALLOCATION_WINDOW = timedelta(days=31)
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
HOURS_PLACES = Decimal("0.0001")
SM_PLACES = Decimal("0.0001")
MONEY = DecimalField(max_digits=28, decimal_places=10)


def round_money(value: Decimal) -> Decimal:
    """The only rounding billing does: a statement line's amount, to cents, half up."""
    return Decimal(value).quantize(CENTS, rounding=ROUND_HALF_UP)


# ---------------------------------------------------------------------------------------------
# Rate cards
# ---------------------------------------------------------------------------------------------


def default_full_prices() -> dict[str, Decimal]:
    return dict(settings.BILLING_DEFAULT_GPU_HOURLY)


@transaction.atomic
def create_rate_card(
    *,
    name: str,
    effective_from: datetime,
    full_prices: dict[str, Decimal],
    overrides: dict[rates.SpecKey, Decimal] | None = None,
    notes: str = "",
    actor=None,
) -> RateCard:
    """A new card: full-GPU prices as given, every catalog MIG profile derived, `overrides` kept as set.

    effective_from must be a whole UTC hour (ValueError otherwise). Not idempotent: a second card at
    the same effective_from violates the unique constraint (IntegrityError).
    """
    if floor_hour(effective_from) != effective_from:
        raise ValueError("effective_from must be a whole UTC hour")
    card = RateCard.objects.create(name=name, effective_from=effective_from, notes=notes, created_by=actor)
    entries = {key: (price, rule, False) for key, price, rule in rates.default_entries(full_prices)}
    for key, price in (overrides or {}).items():
        entries[key] = (rates.quantize_price(Decimal(price)), "override", True)
    RateCardEntry.objects.bulk_create(
        RateCardEntry(
            card=card,
            kind=key.kind,
            product=key.product,
            profile_name=key.profile_name,
            replicas=key.replicas,
            hourly_price=price,
            rule=rule,
            is_override=is_override,
        )
        for key, (price, rule, is_override) in sorted(entries.items(), key=lambda item: _key_order(item[0]))
    )
    return card


def _key_order(key: rates.SpecKey) -> tuple:
    return (key.product, key.kind, key.profile_name, key.replicas)


@transaction.atomic
def rederive_card(card: RateCard) -> int:
    """Recompute every derived (non-override) entry of `card` from its full-GPU entries; add missing MIG entries.

    Called after an operator edits a card's full-GPU prices. Refused (ValueError) for a card already
    in force: history is never repriced. Returns the number of entries written. Idempotent.
    """
    if card.in_force and card.usage_records.exists():
        raise ValueError(f"{card} is in force and has metered usage; add a new card instead")
    entries = list(RateCardEntry.objects.select_for_update().filter(card=card).order_by("pk"))
    full = {e.product: e.hourly_price for e in entries if e.kind == SpecKind.FULL}
    by_key = {e.spec: e for e in entries}
    written = 0
    for key, price, rule in rates.default_entries(full):
        entry = by_key.get(key)
        if entry is None:
            RateCardEntry.objects.create(
                card=card,
                kind=key.kind,
                product=key.product,
                profile_name=key.profile_name,
                replicas=key.replicas,
                hourly_price=price,
                rule=rule,
            )
            written += 1
        elif not entry.is_override and key.kind != SpecKind.FULL and (entry.hourly_price, entry.rule) != (price, rule):
            entry.hourly_price, entry.rule = price, rule
            entry.save(update_fields=["hourly_price", "rule"])
            written += 1
    for entry in entries:
        if entry.kind == SpecKind.TIMESLICE and not entry.is_override and entry.product in full:
            price = rates.derive_price(full[entry.product], entry.spec)
            if entry.hourly_price != price:
                entry.hourly_price, entry.rule = price, rates.derivation_rule(entry.spec)
                entry.save(update_fields=["hourly_price", "rule"])
                written += 1
    return written


@transaction.atomic
def copy_rate_card(card: RateCard, *, effective_from: datetime, name: str = "", actor=None) -> RateCard:
    """A new card with `card`'s entries (overrides kept as overrides), effective from a whole hour.

    The operator then edits the copy's full-GPU prices before it takes effect; derived entries
    follow through rederive_card(). Not idempotent (one card per effective_from).
    """
    if floor_hour(effective_from) != effective_from:
        raise ValueError("effective_from must be a whole UTC hour")
    copy = RateCard.objects.create(
        name=name or f"{card.name} (copy)",
        effective_from=effective_from,
        notes=f"Copied from {card}.",
        created_by=actor,
    )
    RateCardEntry.objects.bulk_create(
        RateCardEntry(
            card=copy,
            kind=e.kind,
            product=e.product,
            profile_name=e.profile_name,
            replicas=e.replicas,
            hourly_price=e.hourly_price,
            is_override=e.is_override,
            rule=e.rule,
        )
        for e in card.entries.order_by("pk")
    )
    return copy


def seed_default_card(*, effective_from: datetime = EPOCH, name: str = "Default") -> tuple[RateCard, bool]:
    """The default card from BILLING_DEFAULT_GPU_HOURLY; (card, created). Idempotent: an existing card at
    `effective_from` is returned untouched."""
    existing = RateCard.objects.filter(effective_from=effective_from).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            return (
                create_rate_card(
                    name=name,
                    effective_from=effective_from,
                    full_prices=default_full_prices(),
                    notes="Seeded from BILLING_DEFAULT_GPU_HOURLY.",
                ),
                True,
            )
    except IntegrityError:
        return RateCard.objects.get(effective_from=effective_from), False


class PriceBook:
    """Every rate card in memory, to price many hours without a query per hour."""

    def __init__(self):
        self.cards = list(RateCard.objects.order_by("effective_from").prefetch_related("entries"))
        self.maps = {card.pk: card.price_map() for card in self.cards}
        self._warned: set = set()

    def card_at(self, hour: datetime) -> RateCard | None:
        found = None
        for card in self.cards:
            if card.effective_from <= hour:
                found = card
            else:
                break
        return found

    def price(self, card: RateCard | None, key: rates.SpecKey, compute_slices: int | None) -> Decimal:
        """The card's entry for `key`; else derived from its full-GPU price; else 0 (logged once per spec)."""
        if card is None:
            return Decimal(0)
        prices = self.maps[card.pk]
        if key in prices:
            return prices[key]
        full = prices.get(rates.spec_key(SpecKind.FULL, key.product))
        if full is not None:
            derived = rates.derive_price(full, key, compute_slices=compute_slices)
            prices[key] = derived
            return derived
        if (card.pk, key) not in self._warned:
            self._warned.add((card.pk, key))
            logger.warning(
                "rate card %s has no price for %s and no full-GPU price to derive one: metered at 0", card, key.label()
            )
        return Decimal(0)


# ---------------------------------------------------------------------------------------------
# Intervals
# ---------------------------------------------------------------------------------------------

Interval = tuple[datetime, datetime]


def _intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out = []
    for a0, a1 in a:
        for b0, b1 in b:
            start, end = max(a0, b0), min(a1, b1)
            if end > start:
                out.append((start, end))
    return out


def _subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out = list(a)
    for b0, b1 in b:
        next_out = []
        for a0, a1 in out:
            if b1 <= a0 or b0 >= a1:
                next_out.append((a0, a1))
                continue
            if a0 < b0:
                next_out.append((a0, b0))
            if b1 < a1:
                next_out.append((b1, a1))
        out = next_out
    return out


def _seconds(intervals: list[Interval]) -> int:
    return int(sum((end - start).total_seconds() for start, end in intervals))


# ---------------------------------------------------------------------------------------------
# Metering
# ---------------------------------------------------------------------------------------------

ALLOCATION_FIELDS = (
    "id",
    "project_id",
    "pool_id",
    "kind",
    "product",
    "profile_name",
    "compute_slices",
    "gpu_id",
    "mig_instance_id",
    "allocated_at",
    "released_at",
    "pool__request_id",
    "pool__request__end_at",
    "pool__request__state",
    "pool__state",
    "gpu__node__timeslice_replicas",
)


@dataclass
class Unit:
    """An allocation as metering sees it."""

    id: int
    project_id: int
    pool_id: int
    kind: str
    product: str
    profile_name: str
    compute_slices: int
    gpu_id: int
    mig_instance_id: int | None
    start: datetime
    stop: datetime | None  # the clock stops here (release or expiry); None = still running
    request_id: int
    failed_now: bool
    replicas: int

    @classmethod
    def from_row(cls, row: dict) -> Unit:
        stops = [t for t in (row["released_at"], row["pool__request__end_at"]) if t is not None]
        return cls(
            id=row["id"],
            project_id=row["project_id"],
            pool_id=row["pool_id"],
            kind=row["kind"],
            product=row["product"],
            profile_name=row["profile_name"],
            compute_slices=row["compute_slices"],
            gpu_id=row["gpu_id"],
            mig_instance_id=row["mig_instance_id"],
            start=row["allocated_at"],
            stop=min(stops) if stops else None,
            request_id=row["pool__request_id"],
            failed_now=row["pool__request__state"] == RequestState.FAILED or row["pool__state"] == PoolState.FAILED,
            replicas=row["gpu__node__timeslice_replicas"] or 1,
        )

    @property
    def spec(self) -> rates.SpecKey:
        return rates.spec_key(self.kind, self.product, self.profile_name, self.replicas)

    def share(self) -> Fraction:
        if self.kind == SpecKind.MIG:
            return rates.mig_share(self.product, self.profile_name, self.compute_slices)
        if self.kind == SpecKind.TIMESLICE:
            return Fraction(1, self.replicas)
        return Fraction(1)

    def clock(self, start: datetime, end: datetime) -> list[Interval]:
        """Where the clock ran within [start, end)."""
        begin, finish = max(self.start, start), min(self.stop or end, end)
        return [(begin, finish)] if finish > begin else []

    def hours(self, until: datetime) -> list[datetime]:
        """The UTC hours in which the clock ran, before `until`."""
        last = min(self.stop or until, until)
        hour, out = floor_hour(self.start), []
        while hour < last:
            out.append(hour)
            hour += HOUR
        return out


def _units(queryset) -> list[Unit]:
    return [Unit.from_row(row) for row in queryset.values(*ALLOCATION_FIELDS).order_by("id")]


def failed_windows(units: list[Unit], until: datetime) -> dict[int, list[Interval]]:
    """Per request: the periods its usage is credited because provisioning had failed.

    A request that has failed and never became active was never delivered: its whole life is
    credited (whatever its state now: failed, provisioning again, released, expired). Once it has
    been active (a retry succeeded, or it failed later), only each failed period is credited: from
    a transition into "failed" to the next transition out of it, or to `until` while it lasts.
    A request or pool failed now with no failure in the history is credited from its last transition.
    """
    failed_now = {u.request_id for u in units if u.failed_now}
    request_ids = {u.request_id for u in units}
    ever_failed = set(
        PoolRequestTransition.objects.filter(request_id__in=request_ids, to_state=RequestState.FAILED, at__lt=until)
        .order_by()
        .values_list("request_id", flat=True)
        .distinct()
    )
    involved = failed_now | ever_failed
    if not involved:
        return {}
    history: dict[int, list[dict]] = defaultdict(list)
    for t in (
        PoolRequestTransition.objects.filter(request_id__in=involved, at__lt=until)
        .order_by("request_id", "at", "id")
        .values("request_id", "from_state", "to_state", "at")
    ):
        history[t["request_id"]].append(t)
    windows: dict[int, list[Interval]] = {}
    for rid in sorted(involved):
        transitions = history.get(rid, [])
        if not any(t["to_state"] == RequestState.ACTIVE for t in transitions):
            windows[rid] = [(EPOCH, until)]
            continue
        periods: list[Interval] = []
        opened: datetime | None = None
        for t in transitions:
            if t["to_state"] == RequestState.FAILED and opened is None:
                opened = t["at"]
            elif t["from_state"] == RequestState.FAILED and opened is not None:
                periods.append((opened, t["at"]))
                opened = None
        if opened is None and rid in failed_now:
            opened = transitions[-1]["at"]
        if opened is not None:
            periods.append((opened, until))
        windows[rid] = periods
    return windows


def health_windows(units: list[Unit], start: datetime, end: datetime) -> dict[int, list[Interval]]:
    """Per allocation: the critical health periods that withheld it within [start, end)."""
    raw = measurements.critical_health_windows(None, start, end)
    if not raw:
        return {}
    gpus = {gpu_id for gpu_id, _ in raw}
    return {u.id: measurements.windows_for(raw, u.gpu_id, u.mig_instance_id) for u in units if u.gpu_id in gpus}


@dataclass
class HourFigures:
    seconds: int
    failed: int
    health: int


def hour_figures(unit: Unit, hour: datetime, failed: list[Interval], health: list[Interval]) -> HourFigures:
    """Reserved, failed-credit and health-credit seconds of `unit` in `hour` (health never double-credits failed)."""
    ran = unit.clock(hour, hour + HOUR)
    seconds = _seconds(ran)
    failed_s = min(seconds, _seconds(_intersect(ran, failed))) if failed else 0
    health_s = 0
    if health:
        health_s = min(seconds - failed_s, _seconds(_subtract(_intersect(ran, health), failed)))
    return HourFigures(seconds, failed_s, health_s)


RECORD_COLUMNS = (
    "allocation_id",
    "hour",
    "project_id",
    "pool_id",
    "kind",
    "product",
    "profile_name",
    "replicas",
    "seconds",
    "failed_credit_seconds",
    "health_credit_seconds",
    "hourly_rate",
    "rate_card_id",
    "sm_activity",
    "energy_kwh",
)
# PostgreSQL array types of RECORD_COLUMNS, for the one-statement INSERT ... SELECT FROM unnest(...).
RECORD_PG_TYPES = (
    "bigint[]",
    "timestamptz[]",
    "bigint[]",
    "bigint[]",
    "varchar[]",
    "varchar[]",
    "varchar[]",
    "smallint[]",
    "integer[]",
    "integer[]",
    "integer[]",
    "numeric[]",
    "bigint[]",
    "numeric[]",
    "numeric[]",
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
                    book.price(card, spec, unit.compute_slices),
                    card_id,
                    m.sm_activity if m else None,
                    m.energy_kwh if m else None,
                )
            )
    return rows


def insert_records(rows: list[tuple]) -> None:
    """INSERT ... ON CONFLICT (allocation, hour) DO NOTHING: a row already metered is never written twice.

    On PostgreSQL one statement over unnest()ed column arrays (the ORM's bulk_create spends most of
    an hour's metering building model instances); elsewhere bulk_create(ignore_conflicts=True),
    which is the same statement.
    """
    if not rows:
        return
    if connection.vendor != "postgresql":
        UsageRecord.objects.bulk_create(
            [UsageRecord(**dict(zip(RECORD_COLUMNS, row, strict=True))) for row in rows],
            batch_size=2000,
            ignore_conflicts=True,
        )
        return
    table = UsageRecord._meta.db_table
    columns = ", ".join(RECORD_COLUMNS)
    arrays = ", ".join(f"%s::{pg_type}" for pg_type in RECORD_PG_TYPES)
    sql = f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 10000):
            chunk = rows[start : start + 10000]
            cursor.execute(sql, [list(column) for column in zip(*chunk, strict=True)])


# Billing waits for provisioning: a pool is metered once its provisioning has completed
# (provisioned_at set; an active pool has completed it too), then from approval (allocated_at).
# A pool still provisioning (a worker died mid-way) or whose provisioning failed and never
# completed is never metered.
PROVISIONED = Q(pool__provisioned_at__isnull=False) | Q(pool__state=PoolState.ACTIVE)


def meter_hour(hour: datetime, *, book: PriceBook | None = None) -> int:
    """Write the UsageRecords of one UTC hour; returns the rows offered for insert.

    Covers every allocation of a provisioned pool (PROVISIONED) whose clock ran in
    [hour, hour + 1 h), plus allocations that have no record at all yet although they started before
    `hour` (created late with a backdated allocated_at, or whose provisioning completed only now):
    those are backfilled from their first hour, i.e. from approval. Idempotent: rows go in with
    INSERT ... ON CONFLICT DO NOTHING on (allocation, hour), so a retry or a concurrent run adds
    nothing twice. Takes no locks itself; meter_usage serialises hours through the watermark.
    """
    book = book or PriceBook()
    end = hour + HOUR
    running = (
        Allocation.objects.filter(PROVISIONED, allocated_at__lt=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=hour))
        .filter(Q(pool__request__end_at__isnull=True) | Q(pool__request__end_at__gt=hour))
    )
    units_hours = [(u, hour) for u in _units(running) if u.clock(hour, end)]
    recent = hour - LATE_ALLOCATION_WINDOW
    late = (
        Allocation.objects.filter(PROVISIONED, allocated_at__lt=hour)
        .filter(Q(allocated_at__gte=recent) | Q(pool__provisioned_at__gte=recent))
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=F("allocated_at")))
        .filter(~Exists(UsageRecord.objects.filter(allocation=OuterRef("pk"))))
    )
    seen = {(u.id, h) for u, h in units_hours}
    for unit in _units(late):
        units_hours.extend((unit, h) for h in unit.hours(hour) if (unit.id, h) not in seen)
    rows = _records_for(units_hours, book, end)
    insert_records(rows)
    return len(rows)


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
            if claimed != 1:
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


# ---------------------------------------------------------------------------------------------
# Credits and showback, recomputed for periods that are still open
# ---------------------------------------------------------------------------------------------


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
    units = {u.id: u for u in _units(allocations.filter(suspects))}
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
                _share(r["kind"], r["product"], r["profile_name"], r["replicas"]),
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


def _share(kind: str, product: str, profile_name: str, replicas: int) -> Fraction:
    if kind == SpecKind.MIG:
        return rates.mig_share(product, profile_name)
    if kind == SpecKind.TIMESLICE:
        return Fraction(1, replicas)
    return Fraction(1)


# ---------------------------------------------------------------------------------------------
# Statements
# ---------------------------------------------------------------------------------------------


def _rate_times(column: str) -> ExpressionWrapper:
    return ExpressionWrapper(F("hourly_rate") * F(column), output_field=MONEY)


def usage_totals(period: date, *, project_ids: list[int] | None = None):
    """One GROUP BY over the month's unbilled records: per project, pool, spec and rate, the seconds a line needs.

    The rate is part of the group, so money is rate x summed seconds, computed exactly in Python
    (_lines_for); the database only adds integers, plus seconds x SM activity and energy.
    """
    start, end = month_bounds(period)
    records = UsageRecord.objects.filter(hour__gte=start, hour__lt=end, billed_on__isnull=True)
    if project_ids is not None:
        records = records.filter(project_id__in=project_ids)
    return usage_keys(records)


def usage_keys(records):
    """Per project, pool, spec and rate: the summed seconds, credits and measurements of `records`."""
    return _grouped(records, "project_id", "pool_id", "kind", "product", "profile_name", "replicas", "hourly_rate")


def _grouped(records, *keys):
    return (
        records.values(*keys)
        .annotate(
            total_seconds=Sum("seconds"),
            failed_seconds=Sum("failed_credit_seconds"),
            health_seconds=Sum("health_credit_seconds"),
            measured_seconds=Sum("seconds", filter=Q(sm_activity__isnull=False)),
            sm_seconds=Sum(ExpressionWrapper(F("seconds") * F("sm_activity"), output_field=MONEY)),
            energy=Sum("energy_kwh"),
        )
        .order_by()
    )


# ---- Which statement bills which usage record -------------------------------------------------
#
# Every record is billed exactly once. A record of month M goes on its project's M statement while
# that one is a draft. Once a statement is finalised, finalise_statement() stamps the records it
# billed (UsageRecord.billed_on), in the same transaction as it writes the lines from exactly those
# records. A record metered later into a finalised month (a late allocation, a pool whose
# provisioning completed late, metering that caught up) has no stamp: it goes on the project's next
# statement that is not finalised, as a carry-over line naming its month, and is stamped when that
# statement is finalised. Stamping is `UPDATE ... WHERE billed_on IS NULL`, so two finalisations
# never bill a record twice, and regenerating never bills anything twice.


def carry_sources(period: date, *, project_ids: list[int] | None = None) -> dict[date, list[int]]:
    """Per earlier month: the projects whose unbilled usage of that month goes on their `period` statement.

    A month's usage is carried over when its statement is finalised. It goes on the project's next
    statement that is not finalised: `period`'s, unless a draft statement lies between the two
    (that draft takes it). Months with no statement at all are passed over.
    """
    statements = Statement.objects.filter(period__lt=period)
    if project_ids is not None:
        statements = statements.filter(project_id__in=project_ids)
    by_project: dict[int, list[tuple[date, str]]] = defaultdict(list)
    for project_id, month, state in statements.order_by("project_id", "-period").values_list(
        "project_id", "period", "state"
    ):
        by_project[project_id].append((month, state))
    sources: dict[date, list[int]] = defaultdict(list)
    for project_id, months in by_project.items():
        for month, state in months:  # newest first: stop at the first draft
            if state != StatementState.FINALISED:
                break
            sources[month].append(project_id)
    return {month: sorted(pids) for month, pids in sorted(sources.items())}


def _scope(period: date, project_ids: list[int] | None, sources: dict[date, list[int]]) -> Q:
    """Records `period`'s statements bill: the month's own, and the months carried over (`sources`)."""
    start, end = month_bounds(period)
    scope = Q(hour__gte=start, hour__lt=end)
    if project_ids is not None:
        scope &= Q(project_id__in=project_ids)
    for month, pids in sources.items():
        month_start_, month_end = month_bounds(month)
        scope |= Q(project_id__in=pids, hour__gte=month_start_, hour__lt=month_end)
    return scope


def billable_records(period: date, *, project_ids: list[int] | None = None, sources=None):
    """The unbilled records that `period`'s statements bill now (own month and carry-overs)."""
    if sources is None:
        sources = carry_sources(period, project_ids=project_ids)
    return UsageRecord.objects.filter(_scope(period, project_ids, sources), billed_on__isnull=True)


def _statement_rows(records, period: date, *, carries: bool = True) -> list[dict]:
    """Grouped records with the month each group was metered in ("usage_period": None for `period` itself).

    `carries=False` (no carry-over months in scope) groups without the month, which is cheaper.
    """
    if not carries:
        rows = list(usage_keys(records))
        for row in rows:
            row["usage_period"] = None
        return rows
    rows = list(
        _grouped(
            records.annotate(usage_month=TruncMonth("hour", tzinfo=UTC)),
            "project_id",
            "usage_month",
            "pool_id",
            "kind",
            "product",
            "profile_name",
            "replicas",
            "hourly_rate",
        )
    )
    for row in rows:
        month = row.pop("usage_month")
        month = month.astimezone(UTC).date() if isinstance(month, datetime) else month
        row["usage_period"] = None if month == period else month
    rows.sort(key=lambda r: (r["project_id"], r["usage_period"] or date.min, r["pool_id"]))
    return rows


def _dec(value) -> Decimal:
    return Decimal(0) if value is None else Decimal(value)


def _hours(seconds) -> Decimal:
    return (_dec(seconds) / HOUR_S).quantize(HOURS_PLACES, rounding=ROUND_HALF_UP)


def _lines_for(statement_id: int | None, row: dict, pool_name: str) -> list[StatementLine]:
    """The usage line of a group and its credit lines; a carry-over group (row["usage_period"]) says its month."""
    spec = rates.spec_key(row["kind"], row["product"], row["profile_name"], row["replicas"])
    rate = _dec(row["hourly_rate"])
    carried = row.get("usage_period")
    label = f"{pool_name}: {spec.label()} @ {rate.normalize():f}/h"
    prefix = f"carry-over from {carried:%Y-%m}: " if carried else ""
    common = dict(
        statement_id=statement_id,
        pool_id=row["pool_id"],
        kind=spec.kind,
        product=spec.product,
        profile_name=spec.profile_name,
        replicas=spec.replicas,
        hourly_rate=rate,
        usage_period=carried,
    )
    seconds, measured_seconds = _dec(row["total_seconds"]), _dec(row["measured_seconds"])
    amount = round_money(rate * seconds / HOUR_S)
    unmeasured = round_money(rate * (seconds - measured_seconds) / HOUR_S)
    used = idle = sm = None
    if measured_seconds:
        used = round_money(rate * _dec(row["sm_seconds"]) / HOUR_S)
        idle = amount - used - unmeasured  # the remainder: used + idle + unmeasured = amount, to the cent
        sm = (_dec(row["sm_seconds"]) / measured_seconds).quantize(SM_PLACES, rounding=ROUND_HALF_UP)
    usage_type = LineType.CARRY_OVER if carried else LineType.USAGE
    lines = [
        StatementLine(
            line_type=usage_type,
            position=LINE_ORDER[usage_type],
            description=(prefix + label)[:200],
            hours=_hours(row["total_seconds"]),
            amount=amount,
            used_amount=used,
            idle_amount=idle,
            unmeasured_amount=unmeasured,
            sm_activity=sm,
            energy_kwh=row["energy"],
            **common,
        )
    ]
    for line_type, seconds_key, why in (
        (LineType.FAILED_CREDIT, "failed_seconds", "provisioning failed"),
        (LineType.HEALTH_CREDIT, "health_seconds", "critical health event"),
    ):
        if row[seconds_key]:
            lines.append(
                StatementLine(
                    line_type=line_type,
                    position=LINE_ORDER[line_type],
                    description=f"{prefix}Credit ({why}) {label}"[:200],
                    hours=_hours(row[seconds_key]),
                    amount=-round_money(rate * _dec(row[seconds_key]) / HOUR_S),
                    reason=why,
                    **common,
                )
            )
    return lines


def draft_lines(period: date, *, project_ids: list[int] | None = None):
    """Unsaved statement lines of the period's own usage so far, per usage group: (row, lines) with row["project_id"].

    The same own-month lines generate_statements() would write now (before carry-overs and
    adjustments): the dashboard's month-to-date costs read them.
    """
    for row in usage_totals(period, project_ids=project_ids):
        yield row, _lines_for(None, row, "")


def _line_sum(field: str, *line_types: str, default: Decimal | None = None):
    """Subquery: the sum of `field` over a statement's lines (of `line_types`), for an UPDATE of statements."""
    lines = StatementLine.objects.filter(statement=OuterRef("pk"))
    if line_types:
        lines = lines.filter(line_type__in=line_types)
    output = StatementLine._meta.get_field(field)
    total = Subquery(lines.order_by().values("statement").annotate(v=Sum(field)).values("v")[:1], output_field=output)
    return total if default is None else Coalesce(total, Value(default), output_field=output)


def refresh_totals(statement_ids: list[int]) -> int:
    """Set the totals of these draft statements from their lines, in one UPDATE; returns rows updated.

    Totals are sums of the (already rounded) lines, so a statement always adds up. Reserved figures
    include carry-over lines (reserved usage of an earlier month billed here). Finalised statements
    are left alone (and the database would refuse anyway).
    """
    usage, credits, adjustment = (
        [LineType.USAGE, LineType.CARRY_OVER],
        [LineType.FAILED_CREDIT, LineType.HEALTH_CREDIT],
        [LineType.ADJUSTMENT],
    )
    zero = Decimal(0)
    return Statement.objects.filter(pk__in=statement_ids, state=StatementState.DRAFT).update(
        reserved_hours=_line_sum("hours", *usage, default=zero),
        reserved_amount=_line_sum("amount", *usage, default=zero),
        credit_amount=_line_sum("amount", *credits, default=zero),
        adjustment_amount=_line_sum("amount", *adjustment, default=zero),
        total_amount=_line_sum("amount", default=zero),
        used_amount=_line_sum("used_amount", *usage),
        idle_amount=_line_sum("idle_amount", *usage),
        unmeasured_amount=_line_sum("unmeasured_amount", *usage, default=zero),
        energy_kwh=_line_sum("energy_kwh", *usage),
        generated_at=timezone.now(),
    )


def _refresh_credits_for(period: date, project_ids: list[int] | None, sources: dict[date, list[int]]) -> None:
    start, end = month_bounds(period)
    refresh_credits(start, end, project_ids=project_ids)
    for month, pids in sources.items():
        refresh_credits(*month_bounds(month), project_ids=pids)


def _rewrite_lines(drafts: dict[int, Statement], rows: list[dict]) -> None:
    """Replace the usage, carry-over and credit lines of these drafts (by project) from `rows`; keep adjustments."""
    draft_ids = [s.pk for s in drafts.values()]
    StatementLine.objects.filter(statement_id__in=draft_ids).exclude(line_type=LineType.ADJUSTMENT).delete()
    pool_names = dict(GpuPool.objects.filter(pk__in={row["pool_id"] for row in rows}).values_list("pk", "name"))
    new_lines: list[StatementLine] = []
    for row in rows:
        statement = drafts.get(row["project_id"])
        if statement is not None:
            new_lines.extend(_lines_for(statement.pk, row, pool_names.get(row["pool_id"], "")))
    StatementLine.objects.bulk_create(new_lines, batch_size=2000)
    refresh_totals(draft_ids)


def generate_statements(period: date, *, project_ids: list[int] | None = None) -> list[Statement]:
    """Create or refresh the draft statements of `period` (a month) from its unbilled usage records.

    Every project with usage to bill gets a statement (those listed in `project_ids`, when given):
    the month's own usage, plus usage metered late into an earlier month whose statement was
    already finalised (carry-over lines naming that month; see carry_sources()). A draft's usage,
    carry-over and credit lines are replaced; its adjustment lines are kept. A finalised statement
    is left exactly as it is. Credits are recomputed first. Nothing is billed here: drafts only
    show; finalise_statement() bills. Locking: the month's statements are locked FOR UPDATE in
    primary-key order, so a concurrent finalise waits for this. Idempotent.
    """
    period = month_start(period)
    sources = carry_sources(period, project_ids=project_ids)
    _refresh_credits_for(period, project_ids, sources)
    with transaction.atomic():
        records = billable_records(period, project_ids=project_ids, sources=sources)
        rows = _statement_rows(records, period, carries=bool(sources))
        wanted = {row["project_id"] for row in rows}
        if project_ids is not None:
            wanted |= set(Project.objects.filter(pk__in=project_ids).values_list("pk", flat=True))
        existing_ids = Statement.objects.filter(period=period)
        if project_ids is not None:
            existing_ids = existing_ids.filter(project_id__in=project_ids)
        wanted |= set(existing_ids.values_list("project_id", flat=True))
        Statement.objects.bulk_create(
            [Statement(project_id=pid, period=period) for pid in sorted(wanted)], ignore_conflicts=True
        )
        statements = list(
            Statement.objects.select_for_update().filter(period=period, project_id__in=wanted).order_by("pk")
        )
        _rewrite_lines({s.project_id: s for s in statements if s.state == StatementState.DRAFT}, rows)
    return list(Statement.objects.filter(pk__in=[s.pk for s in statements]).order_by("project_id"))


def generate_statement(project: Project, period: date) -> Statement:
    """The one project's statement for `period`, created or refreshed (see generate_statements)."""
    return generate_statements(period, project_ids=[project.pk])[0]


def ensure_month_ended(period: date, *, now: datetime | None = None) -> None:
    """MonthNotEnded unless `period` (a month) has ended: its usage is still being metered until then."""
    _, end = month_bounds(month_start(period))
    if (now or timezone.now()) < end:
        raise MonthNotEnded(
            f"{period:%Y-%m} has not ended: usage is still being metered into it. "
            f"Finalise or close it from {end:%Y-%m-%d %H:%M} UTC."
        )


def close_month(period: date, *, run: BillingRun | None = None, now: datetime | None = None) -> list[Statement]:
    """Meter up to the end of `period`, then make every project's draft statement for it.

    Beat runs this on the 1st for the month before; operators run it on demand. Only a month that
    has ended is closed (MonthNotEnded otherwise, recorded in `run`). Tracked in `run` when given.
    Idempotent: a second close refreshes drafts and leaves finalised statements alone.
    """
    period = month_start(period)
    _, end = month_bounds(period)
    try:
        ensure_month_ended(period, now=now)
        meter_usage(until=end)
        crash_point("close.metered")  # fault suite: metered up to the month's end, no statements yet
        statements = generate_statements(period)
        crash_point("close.statements")  # fault suite: statements written, run not marked succeeded
    except Exception as exc:
        if run is not None:
            BillingRun.objects.filter(pk=run.pk).update(
                status=RunStatus.FAILED, finished_at=timezone.now(), error=f"{type(exc).__name__}: {exc}"
            )
        raise
    if run is not None:
        BillingRun.objects.filter(pk=run.pk).update(
            status=RunStatus.SUCCEEDED, finished_at=timezone.now(), statements=len(statements)
        )
    return statements


def start_close_run(period: date, *, actor=None, run: BillingRun | None = None) -> BillingRun:
    """Record a month close (in `run` when given, e.g. the admin's unsaved form instance) and enqueue it on commit.

    MonthNotEnded (nothing recorded) for a month that has not ended.
    """
    from .tasks import close_month_task

    ensure_month_ended(period)
    task_id = str(uuid.uuid4())
    run = run or BillingRun()
    run.kind, run.period, run.requested_by, run.task_id = RunKind.CLOSE, month_start(period), actor, task_id
    run.status = RunStatus.RUNNING
    run.save()
    transaction.on_commit(
        lambda: close_month_task.apply_async(kwargs={"run_id": run.pk}, task_id=task_id, expires=24 * 3600)
    )
    return run


def finalise_statement(statement: Statement, *, actor=None, now: datetime | None = None) -> Statement:
    """Bill a draft: draft -> finalised, with its lines rewritten from exactly the usage it bills.

    Refused with StatementFinalised when it already is, and with MonthNotEnded (nothing changed)
    while its month has not ended. In one transaction, holding the statement row FOR UPDATE: stamps
    the unbilled records it bills (its month's own and carry-overs) with billed_on =
    this statement (`UPDATE ... WHERE billed_on IS NULL`, so no record is ever billed twice, even by
    two finalisations at once), rewrites its usage, carry-over and credit lines from the records
    stamped (adjustments kept), sets the totals, and claims draft -> finalised with a conditional
    UPDATE. A record metered into the month later is carried over to the next statement. A
    finalised statement never changes again (model save/delete and database triggers refuse).
    """
    current = Statement.objects.filter(pk=statement.pk).values_list("state", "project_id", "period").get()
    state, project_id, period = current
    if state != StatementState.DRAFT:
        raise StatementFinalised(f"statement {statement.pk} is already finalised")
    ensure_month_ended(period, now=now)
    _refresh_credits_for(period, [project_id], carry_sources(period, project_ids=[project_id]))
    with transaction.atomic():
        locked = Statement.objects.select_for_update().get(pk=statement.pk)
        if locked.state != StatementState.DRAFT:
            raise StatementFinalised(f"statement {statement.pk} is already finalised")
        sources = carry_sources(period, project_ids=[project_id])
        billable_records(period, project_ids=[project_id], sources=sources).update(billed_on=locked.pk)
        billed = UsageRecord.objects.filter(_scope(period, [project_id], sources), billed_on=locked.pk)
        _rewrite_lines({project_id: locked}, _statement_rows(billed, period, carries=bool(sources)))
        claimed = Statement.objects.filter(pk=locked.pk, state=StatementState.DRAFT).update(
            state=StatementState.FINALISED, finalised_at=timezone.now(), finalised_by=actor
        )
        if claimed != 1:
            raise StatementFinalised(f"statement {statement.pk} is already finalised")
    statement.refresh_from_db()
    return statement


def finalise_statements(statements, *, actor=None, now: datetime | None = None) -> tuple[int, list[str]]:
    """Finalise the drafts among `statements`, in primary-key order.

    Returns (how many were finalised, why the others were refused: months not ended).
    """
    done, refused = 0, []
    for statement in sorted(statements, key=lambda s: s.pk):
        try:
            finalise_statement(statement, actor=actor, now=now)
            done += 1
        except StatementFinalised:
            continue
        except MonthNotEnded as exc:
            refused.append(f"{statement.project.slug} {statement.period:%Y-%m}: {exc}")
    return done, refused


@transaction.atomic
def add_adjustment(statement: Statement, *, amount: Decimal, reason: str, actor=None) -> StatementLine:
    """An operator's adjustment (credit < 0, charge > 0) with a reason.

    On a draft it becomes a line of that statement. A finalised statement never changes: the
    correction becomes an adjustment line of the project's next open period (the next month's
    statement, created as a draft if needed; skipping months already finalised), pointing back at
    the statement it corrects. Locking: the target statement row FOR UPDATE, so it cannot be
    finalised while the line is added.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("An adjustment needs a reason.")
    amount = Decimal(amount)
    if amount == 0:
        raise ValueError("An adjustment of zero changes nothing.")
    if amount != round_money(amount):
        raise ValueError("Adjustments are in whole cents.")
    target = Statement.objects.select_for_update().get(pk=statement.pk)
    corrects = None
    while target.state == StatementState.FINALISED:
        corrects = corrects or target
        period = next_month(target.period)
        Statement.objects.get_or_create(project_id=statement.project_id, period=period)
        target = Statement.objects.select_for_update().get(project_id=statement.project_id, period=period)
    label = f"Adjustment: {reason}" if corrects is None else f"Correction of {corrects.period:%Y-%m}: {reason}"
    line = StatementLine.objects.create(
        statement=target,
        line_type=LineType.ADJUSTMENT,
        description=label[:200],
        amount=amount,
        reason=reason,
        corrects=corrects,
        created_by=actor,
    )
    refresh_totals([target.pk])
    line.statement.refresh_from_db()
    return line


def previous_period(now: datetime | None = None) -> date:
    return previous_month(month_start(now or timezone.now()))


# ---------------------------------------------------------------------------------------------
# Showback charts
# ---------------------------------------------------------------------------------------------


def daily_costs(project_id: int, period: date) -> list[dict]:
    """Per day of the month: reserved and used cost (unrounded sums / 3600), for the admin chart."""
    from django.db.models.functions import TruncDate

    start, end = month_bounds(period)
    rows = (
        UsageRecord.objects.filter(project_id=project_id, hour__gte=start, hour__lt=end)
        .annotate(day=TruncDate("hour", tzinfo=UTC))
        .values("day")
        .annotate(
            reserved=Sum(_rate_times("seconds")),
            used=Sum(ExpressionWrapper(F("hourly_rate") * F("seconds") * F("sm_activity"), output_field=MONEY)),
            seconds=Sum("seconds", output_field=IntegerField()),
        )
        .order_by("day")
    )
    return [
        {
            "day": row["day"],
            "reserved": _dec(row["reserved"]) / HOUR_S,
            "used": None if row["used"] is None else _dec(row["used"]) / HOUR_S,
        }
        for row in rows
    ]
