"""Statement lines from usage records: which records a period's statements bill, grouped and priced.

Amounts are never rounded before statement lines; each line is rounded once to cents
(round_money), and a statement's totals are sums of its lines, so it always adds up.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import (
    BooleanField,
    Case,
    DecimalField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, ExtractHour
from django.db.models.lookups import GreaterThanOrEqual, LessThan
from django.utils import timezone

from capacity.choices import SharingStrategy, SpecKind
from pools.models import Allocation
from pricing import rates
from pricing.services import PriceBook

from .. import measurements
from ..choices import LineType, StatementState
from ..models import CENTS, HOUR_S, LINE_ORDER, RateCard, Statement, StatementLine, UsageRecord
from ..periods import floor_hour, month_bounds

HOURS_PLACES = Decimal("0.0001")
SM_PLACES = Decimal("0.0001")
MONEY = DecimalField(max_digits=28, decimal_places=10)


def round_money(value: Decimal) -> Decimal:
    """The only rounding billing does: a statement line's amount, to cents, half up."""
    return Decimal(value).quantize(CENTS, rounding=ROUND_HALF_UP)


def usage_totals(period: date, *, project_ids: list[int] | None = None) -> list[dict]:
    """One GROUP BY over the month's unbilled records: per project, pool, spec and rate, the seconds a line needs.

    The rate is part of the group, so money is rate x summed seconds, computed exactly in Python
    (lines_for); the database only adds integers, plus seconds x SM activity and energy.
    """
    start, end = month_bounds(period)
    records = UsageRecord.objects.filter(hour__gte=start, hour__lt=end, billed_on__isnull=True)
    if project_ids is not None:
        records = records.filter(project_id__in=project_ids)
    return usage_keys(records)


def usage_keys(records) -> list[dict]:
    """Per project, pool, spec, rate and peak/off-peak: the summed seconds, credits and measurements of `records`."""
    return _grouped(records, "project_id", "pool_id", "kind", "product", "profile_name", "replicas", "hourly_rate")


def off_peak_expression(cards) -> Case | Value:
    """Was a record's hour off-peak on its rate card? The card's window may run past midnight (22 -> 6).

    `cards` are the rate cards with a window; each becomes literal hours in the CASE (RateCard.is_off_peak's
    rule), so the query needs no join to the cards. No such card: plainly False, nothing computed per row.
    """
    hod = ExtractHour("hour", tzinfo=UTC)
    whens = []
    for card in cards:
        start, end = card.off_peak_start_hour, card.off_peak_end_hour
        if start is None or end is None or start == end:
            continue
        if start < end:
            window = Q(GreaterThanOrEqual(hod, start)) & Q(LessThan(hod, end))
        else:
            window = Q(GreaterThanOrEqual(hod, start)) | Q(LessThan(hod, end))
        whens.append(When(Q(rate_card_id=card.pk) & window, then=Value(True)))
    if not whens:
        return Value(False, output_field=BooleanField())
    return Case(*whens, default=Value(False), output_field=BooleanField())


SUMS = ("total_seconds", "failed_seconds", "health_seconds", "measured_seconds", "sm_seconds", "energy")


def _add(a, b):
    """SUM's NULL rule across groups: NULL only when every part is NULL."""
    return b if a is None else a if b is None else a + b


def _grouped(records, *keys) -> list[dict]:
    """Grouped by `keys`, peak/off-peak and, for vGPU records, the card's licence (its line names it).

    The database groups by plain columns (`keys` and the rate card) and the off-peak flag only where a
    card has an off-peak window; the card's licence is looked up here and groups that differ only by
    card are merged (exact sums: integers and fixed-point decimals). A join to the cards and CASE
    expressions on their columns in the GROUP BY made PostgreSQL misjudge the number of groups and sort
    every record instead of hashing (#28: the month close went from 1.8x to 3.8x its GROUP BY floor).
    """
    cards = {
        card.pk: card
        for card in RateCard.objects.only("pk", "off_peak_start_hour", "off_peak_end_hour", "vgpu_licence_hourly")
    }
    grouped = (
        records.annotate(off_peak=off_peak_expression(cards.values()))
        .values(*keys, "rate_card_id", "off_peak")
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
    merged: dict[tuple, dict] = {}
    for row in grouped:
        card = cards.get(row.pop("rate_card_id"))
        row["vgpu_licence"] = card.vgpu_licence_hourly if card is not None and row["kind"] == SpecKind.VGPU else None
        key = tuple(row[k] for k in keys) + (row["off_peak"], row["vgpu_licence"])
        seen = merged.get(key)
        if seen is None:
            merged[key] = row
        else:
            for name in SUMS:
                seen[name] = _add(seen[name], row[name])
    return list(merged.values())


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


def billed_scope(period: date, project_ids: list[int] | None, sources: dict[date, list[int]]) -> Q:
    """Records `period`'s statements bill: the month's own, and the months carried over (`sources`)."""
    start, end = month_bounds(period)
    scope = Q(hour__gte=start, hour__lt=end)
    if project_ids is not None:
        scope &= Q(project_id__in=project_ids)
    for month, pids in sources.items():
        month_start_, month_end = month_bounds(month)
        scope |= Q(project_id__in=pids, hour__gte=month_start_, hour__lt=month_end)
    return scope


def billable_records(period: date, *, project_ids: list[int] | None = None, sources: dict[date, list[int]]):
    """The unbilled records that `period`'s statements bill now (own month and `sources`: carry_sources())."""
    return UsageRecord.objects.filter(billed_scope(period, project_ids, sources), billed_on__isnull=True)


def statement_rows(records, period: date, *, carried=()) -> list[dict]:
    """Grouped records with the month each group was metered in ("usage_period": None for `period` itself).

    `carried` are the earlier months in scope (carry-overs, see carry_sources()). One GROUP BY per month,
    by plain columns only: grouping by the month as an expression made PostgreSQL expect a group per
    record and sort them all.
    """
    rows = []
    for month in [period, *carried]:
        start, end = month_bounds(month)
        scoped = records.filter(hour__gte=start, hour__lt=end) if carried else records
        for row in usage_keys(scoped):
            row["usage_period"] = None if month == period else month
            rows.append(row)
    if carried:
        rows.sort(key=lambda r: (r["project_id"], r["usage_period"] or date.min, r["pool_id"], r["off_peak"]))
    return rows


def as_decimal(value) -> Decimal:
    return Decimal(0) if value is None else Decimal(value)


def _hours(seconds) -> Decimal:
    return (as_decimal(seconds) / HOUR_S).quantize(HOURS_PLACES, rounding=ROUND_HALF_UP)


def lines_for(statement_id: int | None, row: dict, pool_name: str) -> list[StatementLine]:
    """The usage line of a group and its credit lines; a carry-over group (row["usage_period"]) says its month."""
    spec = rates.spec_key(row["kind"], row["product"], row["profile_name"], row["replicas"])
    rate = as_decimal(row["hourly_rate"])
    carried = row.get("usage_period")
    label = f"{pool_name}: {spec.label(row.get('vgpu_licence'))} @ {rate.normalize():f}/h"
    if row.get("off_peak"):
        label += " off-peak"
    prefix = f"carry-over from {carried:%Y-%m}: " if carried else ""
    common = dict(
        statement_id=statement_id,
        pool_id=row["pool_id"],
        **rates.spec_fields(spec),
        hourly_rate=rate,
        usage_period=carried,
    )
    seconds, measured_seconds = as_decimal(row["total_seconds"]), as_decimal(row["measured_seconds"])
    amount = round_money(rate * seconds / HOUR_S)
    unmeasured = round_money(rate * (seconds - measured_seconds) / HOUR_S)
    used = idle = sm = None
    if measured_seconds:
        used = round_money(rate * as_decimal(row["sm_seconds"]) / HOUR_S)
        idle = amount - used - unmeasured  # the remainder: used + idle + unmeasured = amount, to the cent
        sm = (as_decimal(row["sm_seconds"]) / measured_seconds).quantize(SM_PLACES, rounding=ROUND_HALF_UP)
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
                    amount=-round_money(rate * as_decimal(row[seconds_key]) / HOUR_S),
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
        yield row, lines_for(None, row, "")


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
        [LineType.FAILED_CREDIT, LineType.HEALTH_CREDIT, LineType.LENT_CREDIT],
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


# ---- Lines from events: trespass charges and notices of units that ended early ------------------


def event_projects(period: date, *, project_ids: list[int] | None = None) -> set[int]:
    """Projects with a trespass to pay or a unit that ended early in `period`: they get a statement too."""
    start, end = month_bounds(period)
    trespass = measurements.trespasses(start, end, project_ids).values_list("project_id", flat=True)
    ended = _ended_early(start, end, project_ids).values_list("project_id", flat=True)
    return set(trespass) | set(ended)


def _ended_early(start: datetime, end: datetime, project_ids: list[int] | None):
    allocations = Allocation.objects.filter(released_at__gte=start, released_at__lt=end).exclude(end_reason="")
    if project_ids is not None:
        allocations = allocations.filter(project_id__in=project_ids)
    return allocations


def event_lines(period: date, statements: dict[int, int], *, now: datetime | None = None) -> list[StatementLine]:
    """Trespass and notice lines of `period` for the draft statements `statements` ({project id: statement id}).

    Trespass: the offending project pays the unit's list rate (the rate card in force at the hour the
    trespass started; PriceBook, as metering prices a held unit) for the trespass time within the
    month, started_at until ended_at (now while it lasts). The owner of the unit is not named.
    Notice: a unit that ended before its pool did (its MIG instance was destroyed) gets a line
    without charge saying why and when; billing of it stopped at that second.
    """
    if not statements:
        return []
    start, end = month_bounds(period)
    now = now or timezone.now()
    ids = sorted(statements)
    lines: list[StatementLine] = []
    book = None
    events = (
        measurements.trespasses(start, end, ids)
        .select_related("gpu__node", "mig_instance__profile")
        .order_by("started_at", "pk")
    )
    for event in events:
        book = book or PriceBook()
        stop = min(event.ended_at or now, end)
        seconds = int((stop - max(event.started_at, start)).total_seconds())
        if seconds <= 0:
            continue
        kind, profile, slices = _trespassed_spec(event)
        replicas = event.gpu.node.timeslice_replicas if kind in rates.SHARED else 1
        spec = rates.spec_key(kind, event.gpu.catalog_product or event.gpu.product, profile, replicas)
        rate = book.price(book.card_at(floor_hour(event.started_at)), spec, slices)
        whose = "another project's" if event.owner_project_id else "an unallocated"
        pod = f"{event.namespace}/{event.pod_name}" if event.pod_name else "unknown pod"
        lines.append(
            StatementLine(
                statement_id=statements[event.project_id],
                line_type=LineType.TRESPASS,
                position=LINE_ORDER[LineType.TRESPASS],
                description=(
                    f"Trespass: {pod} used {whose} {spec.label()} on {event.gpu.node.name} @ {rate.normalize():f}/h"
                )[:200],
                hours=_hours(seconds),
                amount=round_money(rate * seconds / HOUR_S),
                hourly_rate=rate,
                reason=f"trespass event #{event.pk} from {event.started_at:%Y-%m-%d %H:%M:%S} UTC",
                **rates.spec_fields(spec),
            )
        )
    for allocation in _ended_early(start, end, ids).select_related("pool").order_by("released_at", "pk"):
        lines.append(
            StatementLine(
                statement_id=statements[allocation.project_id],
                pool_id=allocation.pool_id,
                line_type=LineType.NOTICE,
                position=LINE_ORDER[LineType.NOTICE],
                description=(
                    f"{allocation.pool.name}: {allocation.product} {allocation.profile_name} ended, "
                    f"billed until {allocation.released_at:%Y-%m-%d %H:%M:%S} UTC"
                )[:200],
                amount=Decimal(0),
                reason=allocation.end_reason,
            )
        )
    return lines


def _trespassed_spec(event) -> tuple[str, str, int | None]:
    """(kind, MIG profile, compute slices) of the unit a trespass event is on."""
    if event.mig_instance_id:
        profile = event.mig_instance.profile
        return SpecKind.MIG, profile.name, profile.compute_slices
    if event.gpu.node.timeslice_replicas > 1:
        mps = event.gpu.node.sharing_strategy == SharingStrategy.MPS
        return (SpecKind.MPS if mps else SpecKind.TIMESLICE), "", None
    return SpecKind.FULL, "", None
