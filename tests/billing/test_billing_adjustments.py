"""Operators adjust draft statements with a reason; adjustments survive regeneration."""

from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services
from billing.choices import LineType

pytestmark = pytest.mark.django_db


def test_adjustment_on_a_draft_is_kept_when_the_draft_is_regenerated(project, allocate, operator):
    allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    services.meter_usage(now=at("2026-03-10 13:00"))
    statement = services.generate_statement(project, month("2026-03"))

    services.add_adjustment(statement, amount=Decimal("2.25"), reason="Support hours", actor=operator)
    statement = services.generate_statement(project, month("2026-03"))

    assert sorted(statement.lines.values_list("line_type", "amount")) == [
        (LineType.ADJUSTMENT, Decimal("2.25")),
        (LineType.USAGE, Decimal("5.00")),
    ]
    assert (statement.adjustment_amount, statement.total_amount) == (Decimal("2.25"), Decimal("7.25"))


@pytest.mark.parametrize(
    ("amount", "reason", "message"),
    [
        (Decimal("1.00"), "  ", "needs a reason"),
        (Decimal("0"), "x", "zero"),
        (Decimal("0.001"), "x", "whole cents"),
    ],
)
def test_bad_adjustments_are_refused(project, amount, reason, message):
    statement = services.generate_statement(project, month("2026-03"))
    with pytest.raises(ValueError, match=message):
        services.add_adjustment(statement, amount=amount, reason=reason)
    assert statement.lines.count() == 0
