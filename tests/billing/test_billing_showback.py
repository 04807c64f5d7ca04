"""Showback: measured SM activity and energy per allocation-hour from monitoring's hourly rollups.

Used cost = reserved cost x average SM activity; idle = reserved - used (measured hours only);
hours without a final rollup stay NULL ("not measured") and are reported as unmeasured cost.
"""

from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services
from billing.models import UsageRecord
from monitoring.models import Rollup1h, RollupRun, Series

pytestmark = pytest.mark.django_db


def _rollup(series, hour, sm=None, power=None):
    Rollup1h.objects.create(series=series, bucket=at(hour), samples=120, sm_active_avg=sm, power_w_avg=power)


def test_measured_hours_carry_sm_activity_and_energy(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 12:30")
    gpu_series = Series.objects.create(gpu=allocation.gpu)
    _rollup(gpu_series, "2026-03-10 10:00", sm=40.0, power=500.0)
    _rollup(gpu_series, "2026-03-10 12:00", sm=10.0, power=200.0)
    RollupRun.objects.create(level="1h", complete_until=at("2026-03-10 13:00"))

    services.meter_usage(now=at("2026-03-10 13:05"))
    statement = services.generate_statement(project, month("2026-03"))

    assert list(UsageRecord.objects.order_by("hour").values_list("seconds", "sm_activity", "energy_kwh")) == [
        (3600, Decimal("0.4000"), Decimal("0.500000")),
        (3600, None, None),
        (1800, Decimal("0.1000"), Decimal("0.100000")),
    ]
    line = statement.lines.get()
    # Reserved 2.5 h x 2.50 = 6.25; measured 1.5 h = 3.75 of it, used 2.50 x 0.4 + 1.25 x 0.1 = 1.125.
    assert (line.amount, line.used_amount, line.idle_amount, line.unmeasured_amount) == (
        Decimal("6.25"),
        Decimal("1.13"),
        Decimal("2.62"),
        Decimal("2.50"),
    )
    assert (line.sm_activity, line.energy_kwh) == (Decimal("0.3000"), Decimal("0.600000"))
    assert (statement.used_amount, statement.idle_amount, statement.energy_kwh) == (
        Decimal("1.13"),
        Decimal("2.62"),
        Decimal("0.600000"),
    )


def test_mig_unit_uses_its_own_activity_and_its_share_of_gpu_energy(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", kind="mig", profile="3g.40gb")
    _rollup(Series.objects.create(gpu=allocation.gpu), "2026-03-10 10:00", sm=90.0, power=600.0)
    mig_series = Series.objects.create(gpu=allocation.gpu, mig_instance=allocation.mig_instance)
    _rollup(mig_series, "2026-03-10 10:00", sm=25.0)
    RollupRun.objects.create(level="1h", complete_until=at("2026-03-10 11:00"))

    services.meter_usage(now=at("2026-03-10 11:05"))

    assert UsageRecord.objects.values_list("sm_activity", "energy_kwh").get() == (
        Decimal("0.2500"),
        Decimal("0.300000"),
    )


def test_rollups_arriving_after_metering_are_filled_in_later(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    services.meter_usage(now=at("2026-03-10 11:05"))
    assert UsageRecord.objects.values_list("sm_activity", flat=True).get() is None

    _rollup(Series.objects.create(gpu=allocation.gpu), "2026-03-10 10:00", sm=55.0, power=100.0)
    RollupRun.objects.create(level="1h", complete_until=at("2026-03-10 11:00"))
    services.refresh_measurements(at("2026-03-10 00:00"), at("2026-03-11 00:00"))

    assert UsageRecord.objects.values_list("sm_activity", "energy_kwh").get() == (
        Decimal("0.5500"),
        Decimal("0.100000"),
    )


def test_unfinished_rollups_are_not_used(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    _rollup(Series.objects.create(gpu=allocation.gpu), "2026-03-10 10:00", sm=55.0, power=100.0)
    RollupRun.objects.create(level="1h", complete_until=at("2026-03-10 10:00"))

    services.meter_usage(now=at("2026-03-10 11:05"))

    assert UsageRecord.objects.values_list("sm_activity", "energy_kwh").get() == (None, None)


def test_the_meter_applies_rollups_once_they_become_final(project, allocate):
    allocation = allocate(project, "2026-03-10 10:00")
    series = Series.objects.create(gpu=allocation.gpu)
    _rollup(series, "2026-03-10 10:00", sm=20.0, power=300.0)
    run = RollupRun.objects.create(level="1h", complete_until=at("2026-03-10 10:00"))
    services.meter_usage(now=at("2026-03-10 11:05"))
    assert UsageRecord.objects.values_list("sm_activity", flat=True).get() is None

    RollupRun.objects.filter(pk=run.pk).update(complete_until=at("2026-03-10 11:00"))
    services.meter_usage(now=at("2026-03-10 11:35"))  # no new hour to meter; the showback catches up

    assert UsageRecord.objects.values_list("sm_activity", "energy_kwh").get() == (
        Decimal("0.2000"),
        Decimal("0.300000"),
    )
