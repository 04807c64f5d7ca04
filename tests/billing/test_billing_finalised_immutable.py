"""A finalised statement never changes: the service, the model and the database all refuse."""

from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.db import IntegrityError, transaction

from billing import services
from billing.choices import LineType, StatementState
from billing.models import Statement, StatementFinalised, StatementLine

pytestmark = pytest.mark.django_db


@pytest.fixture
def finalised(project, allocate, operator):
    allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    services.meter_usage(now=at("2026-03-10 13:00"))
    statement = services.generate_statement(project, month("2026-03"))
    return services.finalise_statement(statement, actor=operator)


def _snapshot(statement):
    statement = Statement.objects.get(pk=statement.pk)
    lines = list(statement.lines.order_by("pk").values_list("pk", "line_type", "amount", "hours"))
    return statement.state, statement.total_amount, statement.finalised_at, lines


def test_finalise_records_who_and_when(finalised, operator):
    assert finalised.state == StatementState.FINALISED
    assert finalised.finalised_by == operator
    assert finalised.total_amount == Decimal("5.00")


def test_service_refuses_to_finalise_twice_or_regenerate(finalised, project, allocate):
    before = _snapshot(finalised)
    with pytest.raises(StatementFinalised):
        services.finalise_statement(finalised)
    # More usage shows up for March (a late allocation): the finalised statement stays as it was.
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    services.meter_usage(now=at("2026-03-10 14:00"))
    services.generate_statement(project, month("2026-03"))
    assert _snapshot(finalised) == before


def test_model_save_and_delete_refuse(finalised):
    before = _snapshot(finalised)
    statement = Statement.objects.get(pk=finalised.pk)
    statement.total_amount = Decimal("0.01")
    with pytest.raises(StatementFinalised):
        statement.save()
    with pytest.raises(StatementFinalised):
        statement.delete()
    line = statement.lines.get()
    line.amount = Decimal("0.01")
    with pytest.raises(StatementFinalised):
        line.save()
    with pytest.raises(StatementFinalised):
        line.delete()
    with pytest.raises(StatementFinalised):
        StatementLine(statement=statement, line_type=LineType.ADJUSTMENT, description="x", amount=1, reason="r").save()
    assert _snapshot(finalised) == before


def test_database_refuses_bulk_updates_and_deletes(finalised):
    before = _snapshot(finalised)
    with pytest.raises(IntegrityError), transaction.atomic():
        Statement.objects.filter(pk=finalised.pk).update(total_amount=Decimal("0.01"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Statement.objects.filter(pk=finalised.pk).update(state=StatementState.DRAFT)
    with pytest.raises(IntegrityError), transaction.atomic():
        StatementLine.objects.filter(statement=finalised).update(amount=Decimal("0.01"))
    with pytest.raises(IntegrityError), transaction.atomic():
        StatementLine.objects.filter(statement=finalised).delete()
    with pytest.raises(IntegrityError), transaction.atomic():
        StatementLine.objects.bulk_create(
            [StatementLine(statement=finalised, line_type=LineType.ADJUSTMENT, description="x", amount=1, reason="r")]
        )
    assert _snapshot(finalised) == before


def test_correction_becomes_an_adjustment_in_the_next_period(finalised, operator):
    before = _snapshot(finalised)

    line = services.add_adjustment(finalised, amount=Decimal("-1.50"), reason="GPU 3 throttled", actor=operator)

    april = line.statement
    assert (april.period, april.state) == (month("2026-04"), StatementState.DRAFT)
    assert (line.line_type, line.amount, line.corrects, line.created_by) == (
        LineType.ADJUSTMENT,
        Decimal("-1.50"),
        finalised,
        operator,
    )
    assert line.description == "Correction of 2026-03: GPU 3 throttled"
    assert (april.adjustment_amount, april.total_amount) == (Decimal("-1.50"), Decimal("-1.50"))
    assert _snapshot(finalised) == before
