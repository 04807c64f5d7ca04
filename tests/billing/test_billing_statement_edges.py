"""Edges of the statement services the money tests pass by: long reasons and batches with a finalised statement."""

from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services
from billing.choices import LineType, StatementState
from billing.models import Statement, StatementFinalised

pytestmark = pytest.mark.django_db


def test_a_long_adjustment_reason_is_cut_to_the_descriptions_200_characters_and_kept_whole(project, operator):
    statement = services.generate_statement(project, month("2026-03"))
    reason = "Goodwill for the outage of " + "the eu-west cluster, " * 15

    line = services.add_adjustment(statement, amount=Decimal("-12.34"), reason=reason, actor=operator)

    assert line.description == f"Adjustment: {reason.strip()}"[:200]
    assert len(line.description) == 200
    assert line.reason == reason.strip()
    assert Statement.objects.get(pk=statement.pk).total_amount == Decimal("-12.34")


def test_finalising_a_batch_passes_over_a_finalised_statement_and_bills_the_drafts_after_it(
    project, other_project, allocate
):
    allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    allocate(other_project, "2026-03-11 10:00", "2026-03-11 11:00")
    services.meter_usage(now=at("2026-04-01 00:00"))
    first, second = services.generate_statements(month("2026-03"))
    assert first.pk < second.pk and first.project == project
    services.finalise_statement(first, now=at("2026-04-02 00:00"))

    done, refused = services.finalise_statements([second, first], now=at("2026-04-02 00:00"))

    assert (done, refused) == (1, [])
    billed = Statement.objects.get(pk=second.pk)
    assert (billed.project, billed.state) == (other_project, StatementState.FINALISED)
    assert billed.total_amount == Decimal("2.50")
    assert list(billed.lines.values_list("line_type", "amount")) == [(LineType.USAGE, Decimal("2.50"))]


@pytest.mark.parametrize("amount", ["1.005", "-0.001", "-2.499"])
def test_an_adjustment_between_cents_is_refused_whichever_way_it_would_round(project, amount):
    statement = services.generate_statement(project, month("2026-03"))
    with pytest.raises(ValueError, match="whole cents"):
        services.add_adjustment(statement, amount=Decimal(amount), reason="rounding")
    assert statement.lines.count() == 0


def test_finalising_a_finalised_statement_again_is_refused_after_one_read_and_bills_nothing(
    project, allocate, django_assert_num_queries
):
    allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    services.meter_usage(now=at("2026-04-01 00:00"))
    statement = services.finalise_statement(services.generate_statement(project, month("2026-03")))
    assert statement.total_amount == Decimal("5.00")

    with django_assert_num_queries(1), pytest.raises(StatementFinalised, match="already finalised"):
        services.finalise_statement(statement, now=at("2026-04-02 00:00"))
    assert Statement.objects.get(pk=statement.pk).total_amount == Decimal("5.00")
