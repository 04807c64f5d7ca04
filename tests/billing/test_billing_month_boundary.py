"""Usage across midnight at the end of a month lands in each month's statement by UTC hour."""

from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services

pytestmark = pytest.mark.django_db


def test_usage_is_split_at_the_month_boundary(project, allocate):
    allocate(project, "2026-03-31 22:30", "2026-04-01 01:15")

    services.meter_usage(now=at("2026-04-01 02:00"))
    march = services.generate_statement(project, month("2026-03"))
    april = services.generate_statement(project, month("2026-04"))

    assert (march.reserved_hours, march.total_amount) == (Decimal("1.5000"), Decimal("3.75"))
    assert (april.reserved_hours, april.total_amount) == (Decimal("1.2500"), Decimal("3.13"))
    assert march.period.isoformat() == "2026-03-01"
    assert april.lines.get().hours == Decimal("1.2500")
