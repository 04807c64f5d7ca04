"""Units withheld by a critical health event (monitoring.HealthEvent) on their GPU are credited automatically."""

from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services
from billing.choices import LineType
from billing.models import UsageRecord
from monitoring.models import HealthEvent

pytestmark = pytest.mark.django_db


def _event(gpu, opened, resolved=None, *, level="critical", mig_instance=None, rule="xid_critical"):
    return HealthEvent.objects.create(
        gpu=gpu,
        mig_instance=mig_instance,
        rule=rule,
        level=level,
        opened_at=at(opened),
        last_seen_at=at(opened),
        resolved_at=at(resolved) if resolved else None,
    )


def test_critical_event_on_the_gpu_is_credited(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 13:00")
    _event(allocation.gpu, "2026-03-10 11:15", "2026-03-10 12:30")

    services.meter_usage(now=at("2026-03-10 14:00"))
    statement = services.generate_statement(project, month("2026-03"))

    assert list(UsageRecord.objects.order_by("hour").values_list("health_credit_seconds", flat=True)) == [
        0,
        2700,
        1800,
    ]
    credit = statement.lines.get(line_type=LineType.HEALTH_CREDIT)
    assert (credit.hours, credit.amount) == (Decimal("1.2500"), Decimal("-3.13"))
    assert (statement.reserved_amount, statement.credit_amount, statement.total_amount) == (
        Decimal("7.50"),
        Decimal("-3.13"),
        Decimal("4.37"),
    )


def test_warning_events_and_other_gpus_are_not_credited(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    other = allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    _event(allocation.gpu, "2026-03-10 10:00", "2026-03-10 12:00", level="warning", rule="thermal_throttle")
    _event(other.gpu, "2026-03-10 10:30", "2026-03-10 11:00")

    services.meter_usage(now=at("2026-03-10 13:00"))

    assert UsageRecord.objects.filter(allocation=allocation, health_credit_seconds__gt=0).count() == 0
    assert list(
        UsageRecord.objects.filter(allocation=other).order_by("hour").values_list("health_credit_seconds", flat=True)
    ) == [
        1800,
        0,
    ]


def test_mig_level_event_credits_only_the_unit_holding_that_instance(project, allocate):
    three = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", kind="mig", profile="3g.40gb")
    other = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", kind="mig", profile="1g.10gb")
    _event(three.gpu, "2026-03-10 10:00", None, mig_instance=three.mig_instance)
    _event(other.gpu, "2026-03-10 10:00", None, mig_instance=None, rule="ecc_dbe")

    services.meter_usage(now=at("2026-03-10 11:30"))

    assert dict(UsageRecord.objects.values_list("allocation", "health_credit_seconds")) == {
        three.pk: 3600,
        other.pk: 3600,
    }


def test_event_recorded_after_metering_is_credited_when_the_statement_is_made(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    services.meter_usage(now=at("2026-03-10 12:00"))
    _event(allocation.gpu, "2026-03-10 10:45", "2026-03-10 11:30")

    statement = services.generate_statement(project, month("2026-03"))

    assert UsageRecord.objects.get().health_credit_seconds == 900
    assert statement.credit_amount == Decimal("-0.63")


def test_failed_time_is_not_credited_twice(project, allocate):
    from billing_helpers import transition

    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", request_state="released")
    transition(allocation.pool.request, "provisioning", "failed", "2026-03-10 10:10")
    transition(allocation.pool.request, "failed", "provisioning", "2026-03-10 10:50")
    transition(allocation.pool.request, "provisioning", "active", "2026-03-10 10:55")
    transition(allocation.pool.request, "active", "released", "2026-03-10 11:00")
    _event(allocation.gpu, "2026-03-10 10:00", "2026-03-10 11:00")

    services.meter_usage(now=at("2026-03-10 12:00"))

    assert list(UsageRecord.objects.values_list("seconds", "failed_credit_seconds", "health_credit_seconds")) == [
        (3600, 2400, 1200)
    ]
