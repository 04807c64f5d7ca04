"""The clock runs from approval (allocated_at) to release, prorated to the second within each UTC hour."""

from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services
from billing.models import UsageRecord

pytestmark = pytest.mark.django_db


def test_approved_1030_released_1215_is_one_and_three_quarter_hours(project, allocate):
    allocation = allocate(project, "2026-03-10 10:30", "2026-03-10 12:15")

    result = services.meter_usage(now=at("2026-03-10 13:05"))

    assert result.hours == 3
    rows = list(UsageRecord.objects.order_by("hour").values_list("hour", "seconds", "hourly_rate", "allocation"))
    assert rows == [
        (at("2026-03-10 10:00"), 1800, Decimal("2.500000"), allocation.pk),
        (at("2026-03-10 11:00"), 3600, Decimal("2.500000"), allocation.pk),
        (at("2026-03-10 12:00"), 900, Decimal("2.500000"), allocation.pk),
    ]
    statement = services.generate_statement(project, month("2026-03"))
    line = statement.lines.get()
    assert (line.hours, line.amount, line.hourly_rate) == (Decimal("1.7500"), Decimal("4.38"), Decimal("2.500000"))
    assert (statement.reserved_hours, statement.total_amount) == (Decimal("1.7500"), Decimal("4.38"))


def test_the_clock_stops_at_expiry_even_before_the_release_is_processed(project, allocate):
    allocate(project, "2026-03-10 10:00", None, request_end=at("2026-03-10 11:20"))

    services.meter_usage(now=at("2026-03-10 14:00"))

    assert list(UsageRecord.objects.order_by("hour").values_list("seconds", flat=True)) == [3600, 1200]


def test_an_open_allocation_is_metered_only_for_complete_hours(project, allocate):
    allocate(project, "2026-03-10 10:00")

    services.meter_usage(now=at("2026-03-10 11:59"))

    assert list(UsageRecord.objects.values_list("hour", "seconds")) == [(at("2026-03-10 10:00"), 3600)]


def test_mig_and_timeslice_units_are_priced_by_their_share(project, allocate):
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", kind="mig", profile="3g.40gb")
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", kind="timeslice", product="A100-80GB")

    services.meter_usage(now=at("2026-03-10 12:00"))

    assert sorted(UsageRecord.objects.values_list("kind", "profile_name", "replicas", "hourly_rate")) == [
        ("mig", "3g.40gb", 1, Decimal("1.250000")),
        ("timeslice", "", 4, Decimal("0.400000")),
    ]
