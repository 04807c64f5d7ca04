"""Nothing metered is ever dropped: each usage record is billed exactly once, late usage is carried over."""

import csv
import io
from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.db.models import Count

from billing import services
from billing.choices import LineType, StatementState
from billing.models import Statement, StatementLine, UsageRecord

pytestmark = pytest.mark.django_db


def _snapshot(statement):
    statement = Statement.objects.get(pk=statement.pk)
    lines = list(statement.lines.order_by("pk").values_list("pk", "line_type", "amount", "hours"))
    return statement.state, statement.total_amount, statement.finalised_at, lines


@pytest.fixture
def march_finalised(project, allocate, operator):
    """March billed and finalised: 2 h of a full H100 (5.00)."""
    allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    services.meter_usage(now=at("2026-04-01 01:00"))
    statement = services.generate_statement(project, month("2026-03"))
    return services.finalise_statement(statement, actor=operator)


def _late_march_probe(project, allocate):
    """A probe's 4 h at the end of March, written only after March was finalised (backdated allocation)."""
    probe = allocate(project, "2026-03-31 20:00", "2026-04-01 02:00")
    services.meter_usage(now=at("2026-04-01 06:00"))
    return probe


def test_late_usage_of_a_finalised_month_is_carried_over_to_the_next_statement(project, allocate, march_finalised):
    before = _snapshot(march_finalised)
    probe = _late_march_probe(project, allocate)

    april = services.generate_statement(project, month("2026-04"))

    assert _snapshot(march_finalised) == before
    lines = list(april.lines.order_by(*StatementLine._meta.ordering))
    assert [(x.line_type, x.usage_period, x.description, x.hours, x.amount) for x in lines] == [
        (LineType.USAGE, None, f"{probe.pool.name}: H100-80GB full GPU @ 2.5/h", Decimal("2.0000"), Decimal("5.00")),
        (
            LineType.CARRY_OVER,
            month("2026-03"),
            f"carry-over from 2026-03: {probe.pool.name}: H100-80GB full GPU @ 2.5/h",
            Decimal("4.0000"),
            Decimal("10.00"),
        ),
    ]
    assert (april.reserved_hours, april.reserved_amount, april.total_amount) == (
        Decimal("6.0000"),
        Decimal("15.00"),
        Decimal("15.00"),
    )


def test_every_record_is_billed_exactly_once_however_often_things_rerun(project, allocate, march_finalised):
    _late_march_probe(project, allocate)
    for _ in range(2):
        services.meter_usage(now=at("2026-05-01 01:00"))
        services.generate_statements(month("2026-04"))
        services.generate_statements(month("2026-03"))
    april = services.finalise_statement(Statement.objects.get(period=month("2026-04")))
    may = services.generate_statement(project, month("2026-05"))

    billed = dict(
        UsageRecord.objects.order_by("billed_on")
        .values_list("billed_on")
        .annotate(n=Count("pk"))
        .values_list("billed_on", "n")
    )
    assert billed == {march_finalised.pk: 2, april.pk: 6}
    assert UsageRecord.objects.filter(billed_on__isnull=True).count() == 0
    assert (april.state, april.total_amount) == (StatementState.FINALISED, Decimal("15.00"))
    assert (may.total_amount, may.lines.count()) == (Decimal("0.00"), 0)
    # All that was metered was billed once: 8 h x 2.50.
    assert march_finalised.total_amount + april.total_amount + may.total_amount == Decimal("20.00")


def test_carry_over_skips_finalised_months_and_goes_to_the_next_open_statement(project, allocate, march_finalised):
    april = services.finalise_statement(services.generate_statement(project, month("2026-04")))
    april_before = _snapshot(april)
    probe = allocate(project, "2026-03-31 22:00", "2026-03-31 23:00")
    services.meter_usage(now=at("2026-05-01 01:00"))

    services.generate_statement(project, month("2026-04"))
    may = services.generate_statement(project, month("2026-05"))

    assert _snapshot(april) == april_before
    assert list(may.lines.values_list("line_type", "usage_period", "amount")) == [
        (LineType.CARRY_OVER, month("2026-03"), Decimal("2.50"))
    ]
    services.finalise_statement(may)
    assert UsageRecord.objects.get(allocation=probe).billed_on_id == may.pk


def test_the_earliest_open_draft_takes_the_carry_over_not_a_later_one(project, allocate, march_finalised):
    _late_march_probe(project, allocate)
    services.meter_usage(now=at("2026-05-01 01:00"))
    april = services.generate_statement(project, month("2026-04"))
    may = services.generate_statement(project, month("2026-05"))

    assert april.lines.filter(line_type=LineType.CARRY_OVER).count() == 1
    assert may.lines.filter(line_type=LineType.CARRY_OVER).count() == 0


def test_usage_metered_after_the_draft_was_made_is_on_the_finalised_statement(project, allocate, operator):
    allocate(project, "2026-03-10 10:00", "2026-03-10 14:00")
    services.meter_usage(now=at("2026-03-10 12:00"))
    draft = services.generate_statement(project, month("2026-03"))
    assert draft.total_amount == Decimal("5.00")
    services.meter_usage(now=at("2026-04-01 00:00"))

    finalised = services.finalise_statement(draft, actor=operator)

    assert (finalised.reserved_hours, finalised.total_amount) == (Decimal("4.0000"), Decimal("10.00"))
    assert set(UsageRecord.objects.values_list("billed_on", flat=True)) == {finalised.pk}


def test_carried_over_credits_name_their_month(project, allocate, march_finalised):
    from billing_helpers import transition

    probe = allocate(project, "2026-03-31 20:00", "2026-03-31 22:00", request_state="released")
    transition(probe.pool.request, "provisioning", "failed", "2026-03-31 20:00")
    transition(probe.pool.request, "failed", "provisioning", "2026-03-31 21:00")
    transition(probe.pool.request, "provisioning", "active", "2026-03-31 21:00")
    services.meter_usage(now=at("2026-04-01 06:00"))

    april = services.generate_statement(project, month("2026-04"))

    assert list(
        april.lines.order_by(*StatementLine._meta.ordering).values_list("line_type", "usage_period", "amount")
    ) == [
        (LineType.CARRY_OVER, month("2026-03"), Decimal("5.00")),
        (LineType.FAILED_CREDIT, month("2026-03"), Decimal("-2.50")),
    ]
    credit = april.lines.get(line_type=LineType.FAILED_CREDIT)
    assert (
        credit.description
        == f"carry-over from 2026-03: Credit (provisioning failed) {probe.pool.name}: H100-80GB full GPU @ 2.5/h"
    )
    assert (april.reserved_amount, april.credit_amount, april.total_amount) == (
        Decimal("5.00"),
        Decimal("-2.50"),
        Decimal("2.50"),
    )


def test_carry_over_appears_in_the_csv_export(project, allocate, march_finalised, operator):
    from billing import exports

    _late_march_probe(project, allocate)
    april = services.generate_statement(project, month("2026-04"))

    text = "".join(exports.iter_csv(exports.statements_for_export(Statement.objects.filter(pk=april.pk))))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["line_type"], r["usage_period"], r["description"][:25], r["amount"]) for r in rows] == [
        ("usage", "", "pool-2: H100-80GB full GP", "5.00"),
        ("carry_over", "2026-03", "carry-over from 2026-03: ", "10.00"),
    ]


def test_a_month_with_no_statement_is_passed_over_and_never_bills_the_carry_over_again(
    project, allocate, march_finalised
):
    """March finalised, no April statement, May made first: May carries March's late hours; April, made
    afterwards, is the earliest open statement now, but May has already billed them."""
    probe = allocate(project, "2026-03-31 22:00", "2026-03-31 23:00")
    services.meter_usage(now=at("2026-06-01 00:00"))
    may = services.generate_statement(project, month("2026-05"))
    assert list(may.lines.values_list("line_type", "usage_period", "amount")) == [
        (LineType.CARRY_OVER, month("2026-03"), Decimal("2.50"))
    ]
    may = services.finalise_statement(may)

    april = services.generate_statement(project, month("2026-04"))

    assert list(april.lines.values_list("line_type", flat=True)) == []
    assert UsageRecord.objects.get(allocation=probe).billed_on_id == may.pk
    april = services.finalise_statement(april)
    assert (april.total_amount, UsageRecord.objects.get(allocation=probe).billed_on_id) == (Decimal("0.00"), may.pk)
