"""Failed provisioning is not charged; after a successful retry only the failed time is credited."""

from decimal import Decimal

import pytest
from billing_helpers import at, month, transition

from billing import services
from billing.models import UsageRecord
from pools.models import GpuPool

pytestmark = pytest.mark.django_db


def test_failed_request_never_active_is_not_charged(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", request_state="provisioning", pool_state="failed")
    request = allocation.pool.request
    transition(request, "approved", "provisioning", "2026-03-10 10:00")
    transition(request, "provisioning", "failed", "2026-03-10 10:20")

    services.meter_usage(now=at("2026-03-10 13:00"))
    statement = services.generate_statement(project, month("2026-03"))

    assert UsageRecord.objects.count() == 0  # provisioning never completed: never metered
    assert (statement.reserved_amount, statement.credit_amount, statement.total_amount) == (
        Decimal("0.00"),
        Decimal("0.00"),
        Decimal("0.00"),
    )
    assert statement.lines.count() == 0


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


def test_pool_stuck_in_provisioning_is_not_metered_and_then_fails(project, allocate):
    """A worker died mid-provisioning: hours pass with the pool unprovisioned; billing does not run."""
    allocation = allocate(project, "2026-03-10 10:00", request_state="provisioning", pool_state="provisioning")
    services.meter_usage(now=at("2026-03-10 14:00"))
    assert UsageRecord.objects.count() == 0

    transition(allocation.pool.request, "provisioning", "failed", "2026-03-10 14:30")
    GpuPool.objects.filter(pk=allocation.pool_id).update(state="failed")
    services.meter_usage(now=at("2026-03-10 18:00"))
    statement = services.generate_statement(project, month("2026-03"))

    assert UsageRecord.objects.count() == 0
    assert statement.total_amount == Decimal("0.00")


def test_provisioning_completed_late_is_billed_from_approval(project, allocate):
    allocation = allocate(project, "2026-03-10 10:30", request_state="provisioning", pool_state="provisioning")
    services.meter_usage(now=at("2026-03-10 13:00"))
    assert UsageRecord.objects.count() == 0

    transition(allocation.pool.request, "provisioning", "active", "2026-03-10 13:20")
    GpuPool.objects.filter(pk=allocation.pool_id).update(state="active", provisioned_at=at("2026-03-10 13:20"))
    services.meter_usage(now=at("2026-03-10 15:00"))
    statement = services.generate_statement(project, month("2026-03"))

    assert list(UsageRecord.objects.order_by("hour").values_list("hour", "seconds")) == [
        (at("2026-03-10 10:00"), 1800),
        (at("2026-03-10 11:00"), 3600),
        (at("2026-03-10 12:00"), 3600),
        (at("2026-03-10 13:00"), 3600),
        (at("2026-03-10 14:00"), 3600),
    ]
    assert (statement.reserved_hours, statement.total_amount) == (Decimal("4.5000"), Decimal("11.25"))


def test_released_pool_whose_provisioning_never_completed_is_not_billed(project, allocate):
    allocate(
        project,
        "2026-03-10 10:00",
        "2026-03-10 12:00",
        request_state="released",
        pool_state="released",
        provisioned=None,
    )
    services.meter_usage(now=at("2026-03-10 13:00"))
    assert UsageRecord.objects.count() == 0


def test_provisioning_completed_weeks_later_is_still_backfilled_from_approval(project, allocate):
    allocation = allocate(
        project, "2026-03-01 00:00", "2026-03-01 02:00", request_state="provisioning", pool_state="provisioning"
    )
    services.meter_usage(now=at("2026-04-10 00:00"))
    assert UsageRecord.objects.count() == 0

    GpuPool.objects.filter(pk=allocation.pool_id).update(state="active", provisioned_at=at("2026-04-10 00:30"))
    services.meter_usage(now=at("2026-04-10 02:00"))

    assert list(UsageRecord.objects.order_by("hour").values_list("hour", flat=True)) == [
        at("2026-03-01 00:00"),
        at("2026-03-01 01:00"),
    ]


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


def test_billing_time_begins_at_the_default_cards_epoch_and_seeding_it_again_adds_no_card(db):
    """The migration seeds the default card at the start of billing time (services.EPOCH, 2000-01-01 UTC), where a
    never-delivered request's credit also starts; `billing seed` and the demo world seed it again and must find
    that card, not add a second one."""
    from datetime import UTC, datetime

    from pricing.models import RateCard

    before = list(RateCard.objects.values_list("pk", "effective_from"))
    assert [when for _, when in before] == [datetime(2000, 1, 1, tzinfo=UTC)]

    card, created = services.seed_default_card()

    assert (card.pk, created) == (before[0][0], False)
    assert list(RateCard.objects.values_list("pk", "effective_from")) == before
