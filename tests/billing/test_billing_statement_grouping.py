"""Statement lines are grouped in the database by plain columns, then by rate card and off-peak in Python (#28).

The lines must be exactly those of the straightforward query the close used before: one GROUP BY
joined to the rate cards, with the off-peak flag, the vGPU licence and the usage month as
expressions (`reference_rows` below keeps that query as the specification). The world mixes what
makes the two differ: several cards with the same rate (merged into one line), off-peak windows
(wrapping midnight and within a day), vGPU licences that differ by card, measured and unmeasured
hours, and usage carried over from a finalised month.
"""

from datetime import UTC, timedelta
from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.db.models import BooleanField, Case, DecimalField, ExpressionWrapper, F, Q, Sum, Value, When
from django.db.models.functions import ExtractHour, TruncMonth
from django.db.models.lookups import GreaterThanOrEqual, LessThan

from billing import services
from billing.models import Statement, StatementLine, UsageRecord
from billing.services.lines import billable_records, carry_sources, lines_for
from pools.models import GpuPool
from pricing.models import RateCard

pytestmark = pytest.mark.django_db
KEYS = ("project_id", "pool_id", "kind", "product", "profile_name", "replicas", "hourly_rate")
LINE_FIELDS = (
    "line_type", "position", "pool_id", "kind", "product", "profile_name", "replicas", "description",
    "hourly_rate", "hours", "amount", "used_amount", "idle_amount", "unmeasured_amount", "sm_activity",
    "energy_kwh", "reason", "usage_period",
)  # fmt: skip


def reference_rows(records, period):
    """The grouping as it was: a join to the cards, expressions in the GROUP BY."""
    start, end = F("rate_card__off_peak_start_hour"), F("rate_card__off_peak_end_hour")
    hod = ExtractHour("hour", tzinfo=UTC)
    off_peak = Case(
        When(
            Q(rate_card__off_peak_start_hour__lt=end) & Q(GreaterThanOrEqual(hod, start)) & Q(LessThan(hod, end)),
            then=Value(True),
        ),
        When(
            Q(rate_card__off_peak_start_hour__gt=end) & (Q(GreaterThanOrEqual(hod, start)) | Q(LessThan(hod, end))),
            then=Value(True),
        ),
        default=Value(False),
        output_field=BooleanField(),
    )
    licence = Case(When(kind="vgpu", then=F("rate_card__vgpu_licence_hourly")), default=None)
    rows = (
        records.annotate(off_peak=off_peak, vgpu_licence=licence, usage_month=TruncMonth("hour", tzinfo=UTC))
        .values(*KEYS, "usage_month", "off_peak", "vgpu_licence")
        .annotate(
            total_seconds=Sum("seconds"),
            failed_seconds=Sum("failed_credit_seconds"),
            health_seconds=Sum("health_credit_seconds"),
            measured_seconds=Sum("seconds", filter=Q(sm_activity__isnull=False)),
            sm_seconds=Sum(
                ExpressionWrapper(
                    F("seconds") * F("sm_activity"), output_field=DecimalField(max_digits=28, decimal_places=10)
                )
            ),
            energy=Sum("energy_kwh"),
        )
        .order_by()
    )
    out = []
    for row in rows:
        used = row.pop("usage_month")
        used = used.astimezone(UTC).date() if hasattr(used, "astimezone") else used
        row["usage_period"] = None if used == period else used
        out.append(row)
    return out


def card(name, effective_from, *, window=None, licence="0.35", rate="2.50"):
    made = services.create_rate_card(
        name=name, effective_from=at(effective_from), full_prices={"H100-80GB": Decimal(rate)}
    )
    start, end = window or (None, None)
    RateCard.objects.filter(pk=made.pk).update(
        off_peak_start_hour=start, off_peak_end_hour=end, vgpu_licence_hourly=Decimal(licence)
    )
    return made


def record(allocation, hour, rate_card, *, kind="full", profile="", replicas=1, rate="2.500000", seconds=3600, **extra):
    return UsageRecord(
        allocation=allocation,
        hour=hour,
        project_id=allocation.project_id,
        pool_id=allocation.pool_id,
        kind=kind,
        product="H100-80GB",
        profile_name=profile,
        replicas=replicas,
        seconds=seconds,
        hourly_rate=Decimal(rate),
        rate_card=rate_card,
        **extra,
    )


def as_tuples(lines):
    """Each line's fields as stored (an unsaved line's decimals rounded to its column, as saving does)."""
    out = []
    for line in lines:
        values = []
        for name in LINE_FIELDS:
            value = getattr(line, name)
            places = getattr(StatementLine._meta.get_field(name), "decimal_places", None)
            if places is not None and value is not None:
                value = Decimal(str(value)).quantize(Decimal(1).scaleb(-places))
            values.append(str(value))
        out.append(tuple(values))
    return sorted(out)


@pytest.fixture
def world(project, other_project, allocate):
    """Two projects' usage in February (finalised for `project`, then some metered late) and March 2026."""
    plain = card("Plain", "2026-02-01 00:00")
    same_rate = card("Same rate, other card", "2026-03-05 00:00")  # same rate as `plain`: one line
    night = card("Night", "2026-03-10 00:00", window=(22, 6), licence="0.50")
    day = card("Day", "2026-03-20 00:00", window=(9, 12), licence="0.50")
    full = allocate(project, "2026-02-01 00:00")
    vgpu = allocate(project, "2026-02-01 00:00")
    other = allocate(other_project, "2026-02-01 00:00")
    rows = []
    hour = at("2026-02-27 00:00")
    while hour < at("2026-04-01 00:00"):
        c = plain if hour.month == 2 else day if hour.day >= 20 else night if hour.day >= 10 else same_rate
        if hour.month == 3 and hour.day < 5:
            c = plain
        n = int(hour.timestamp()) // 3600
        measured = {"sm_activity": Decimal(n % 10) / 10, "energy_kwh": Decimal("0.123456")} if n % 3 else {}
        rows.append(record(full, hour, c, **measured))
        rows.append(record(vgpu, hour, c, kind="vgpu", profile="H100XM-20C", replicas=4, rate="0.725000", **measured))
        rows.append(record(other, hour, c, seconds=1800 + n % 1800))
        hour += timedelta(hours=1)
    UsageRecord.objects.bulk_create(rows)
    february = services.generate_statement(project, month("2026-02"))
    services.finalise_statement(february)
    # Metered late into February after it was finalised: carried over to March.
    late = allocate(project, "2026-02-01 00:00")
    UsageRecord.objects.bulk_create(
        [record(late, at("2026-02-28 20:00") + timedelta(hours=h), plain, sm_activity=Decimal("0.5")) for h in range(4)]
    )
    return project, other_project


def test_lines_are_those_of_the_joined_group_by(world):
    period = month("2026-03")
    sources = carry_sources(period)
    assert sources == {month("2026-02"): [world[0].pk]}

    statements = services.generate_statements(period)

    # After it: the close refreshes credits first (and bills nothing), so the same records.
    names = dict(GpuPool.objects.values_list("pk", "name"))
    expected = {}
    for row in reference_rows(billable_records(period, sources=sources), period):
        expected.setdefault(row["project_id"], []).extend(lines_for(None, row, names[row["pool_id"]]))

    assert [s.project_id for s in statements] == sorted(p.pk for p in world)
    for statement in statements:
        lines = StatementLine.objects.filter(statement=statement)
        assert as_tuples(lines) == as_tuples(expected[statement.project_id])
    # What the world exercises: merged cards, both windows, two licences, a carry-over.
    lines = StatementLine.objects.filter(statement__in=statements)
    assert lines.filter(description__endswith="off-peak").count() >= 2
    assert lines.filter(description__contains="licence 0.5/h").exists()
    assert lines.filter(description__contains="licence 0.35/h").exists()
    assert lines.filter(line_type="carry_over").count() == 1
    plain_rate = [line for line in lines if line.description.endswith("full GPU @ 2.5/h") and line.usage_period is None]
    assert len(plain_rate) == 2  # one line per project although the rate came from three cards


def test_a_second_close_writes_the_same_lines(world):
    period = month("2026-03")
    first = services.generate_statements(period)
    before = as_tuples(StatementLine.objects.filter(statement__in=first))
    totals = list(Statement.objects.filter(period=period).order_by("project_id").values_list("total_amount", flat=True))
    second = services.generate_statements(period)
    assert as_tuples(StatementLine.objects.filter(statement__in=second)) == before
    assert (
        list(Statement.objects.filter(period=period).order_by("project_id").values_list("total_amount", flat=True))
        == totals
    )
