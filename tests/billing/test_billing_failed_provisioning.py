"""Failed provisioning is not charged; after a successful retry only the failed time is credited."""

from decimal import Decimal

import pytest
from billing_helpers import at, month, transition

from billing import services
from billing.choices import LineType
from billing.models import UsageRecord

pytestmark = pytest.mark.django_db


def test_failed_request_never_active_is_not_charged(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", request_state="provisioning", pool_state="failed")
    request = allocation.pool.request
    transition(request, "approved", "provisioning", "2026-03-10 10:00")
    transition(request, "provisioning", "failed", "2026-03-10 10:20")

    services.meter_usage(now=at("2026-03-10 13:00"))
    statement = services.generate_statement(project, month("2026-03"))

    assert list(UsageRecord.objects.values_list("seconds", "failed_credit_seconds")) == [(3600, 3600)] * 3
    assert (statement.reserved_amount, statement.credit_amount, statement.total_amount) == (
        Decimal("7.50"),
        Decimal("-7.50"),
        Decimal("0.00"),
    )
    credit = statement.lines.get(line_type=LineType.FAILED_CREDIT)
    assert (credit.hours, credit.amount, credit.reason) == (Decimal("3.0000"), Decimal("-7.50"), "provisioning failed")


def test_failed_then_released_without_ever_running_is_not_charged(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 12:00", request_state="released")
    request = allocation.pool.request
    transition(request, "approved", "provisioning", "2026-03-10 10:00")
    transition(request, "provisioning", "failed", "2026-03-10 10:40")
    transition(request, "failed", "released", "2026-03-10 12:00")

    services.meter_usage(now=at("2026-03-10 13:00"))

    assert services.generate_statement(project, month("2026-03")).total_amount == Decimal("0.00")


def test_retry_succeeds_clock_runs_from_approval_and_failed_time_is_credited(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 14:00", request_state="released")
    request = allocation.pool.request
    transition(request, "approved", "provisioning", "2026-03-10 10:00")
    transition(request, "provisioning", "failed", "2026-03-10 10:30")
    transition(request, "failed", "provisioning", "2026-03-10 12:00")
    transition(request, "provisioning", "active", "2026-03-10 12:10")
    transition(request, "active", "released", "2026-03-10 14:00")

    services.meter_usage(now=at("2026-03-10 15:00"))
    statement = services.generate_statement(project, month("2026-03"))

    assert list(UsageRecord.objects.order_by("hour").values_list("seconds", "failed_credit_seconds")) == [
        (3600, 1800),
        (3600, 3600),
        (3600, 0),
        (3600, 0),
    ]
    assert (statement.reserved_amount, statement.credit_amount, statement.total_amount) == (
        Decimal("10.00"),
        Decimal("-3.75"),
        Decimal("6.25"),
    )


def test_failure_recorded_after_metering_is_credited_at_statement_time(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", request_state="provisioning", pool_state="provisioning")
    services.meter_usage(now=at("2026-03-10 12:00"))
    assert UsageRecord.objects.filter(failed_credit_seconds__gt=0).count() == 0

    transition(allocation.pool.request, "provisioning", "failed", "2026-03-10 12:30")
    statement = services.generate_statement(project, month("2026-03"))

    assert list(UsageRecord.objects.values_list("failed_credit_seconds", flat=True)) == [3600, 3600]
    assert statement.total_amount == Decimal("0.00")


def test_two_failures_before_a_successful_retry_are_both_credited(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 13:00", request_state="released")
    request = allocation.pool.request
    transition(request, "approved", "provisioning", "2026-03-10 10:00")
    transition(request, "provisioning", "failed", "2026-03-10 10:30")
    transition(request, "failed", "provisioning", "2026-03-10 11:00")
    transition(request, "provisioning", "failed", "2026-03-10 11:15")
    transition(request, "failed", "provisioning", "2026-03-10 12:00")
    transition(request, "provisioning", "active", "2026-03-10 12:30")
    transition(request, "active", "released", "2026-03-10 13:00")

    services.meter_usage(now=at("2026-03-10 14:00"))

    assert list(UsageRecord.objects.order_by("hour").values_list("failed_credit_seconds", flat=True)) == [
        1800,
        2700,
        0,
    ]
