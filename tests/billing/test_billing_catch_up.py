"""After downtime metering catches up every missed hour, once; late-created allocations are backfilled."""

from datetime import timedelta

import pytest
from billing_helpers import at
from django.db.models import Count, Sum

from billing import services
from billing.models import MeteringWatermark, UsageRecord

pytestmark = pytest.mark.django_db


def test_gap_is_caught_up_hour_by_hour_without_double_counting(project, allocate):
    allocate(project, "2026-03-10 09:00")
    services.meter_usage(now=at("2026-03-10 10:05"))
    assert UsageRecord.objects.count() == 1

    # The workers were down for a day and a bit.
    result = services.meter_usage(now=at("2026-03-11 13:05"))

    assert result.hours == 27
    hours = list(UsageRecord.objects.order_by("hour").values_list("hour", flat=True))
    assert hours == [at("2026-03-10 09:00") + timedelta(hours=h) for h in range(28)]
    assert MeteringWatermark.objects.get().metered_until == at("2026-03-11 13:00")
    # Running again changes nothing.
    assert services.meter_usage(now=at("2026-03-11 13:59")).hours == 0
    assert UsageRecord.objects.aggregate(n=Count("id"), s=Sum("seconds")) == {"n": 28, "s": 28 * 3600}


def test_allocation_created_after_its_hours_were_metered_is_backfilled(project, allocate):
    allocate(project, "2026-03-10 08:00")
    services.meter_usage(now=at("2026-03-10 12:00"))
    # Provisioning wrote this allocation late, with allocated_at = the approval at 09:30.
    late = allocate(project, "2026-03-10 09:30", "2026-03-10 11:10")

    services.meter_usage(now=at("2026-03-10 13:00"))

    assert list(UsageRecord.objects.filter(allocation=late).order_by("hour").values_list("hour", "seconds")) == [
        (at("2026-03-10 09:00"), 1800),
        (at("2026-03-10 10:00"), 3600),
        (at("2026-03-10 11:00"), 600),
    ]


def test_metering_an_hour_twice_inserts_nothing_more(project, allocate):
    allocate(project, "2026-03-10 09:00", "2026-03-10 10:00")

    first = services.meter_hour(at("2026-03-10 09:00"))
    again = services.meter_hour(at("2026-03-10 09:00"))

    assert (first, again) == (1, 1)
    assert UsageRecord.objects.count() == 1
