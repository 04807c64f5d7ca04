"""What metering measures of each unit in an hour (billing.measurements): SM activity from the unit's own series
(a MIG instance's, else its GPU's) less the seconds another project's pod ran on it, and energy from its GPU's
power or, without power, its energy counter, times the unit's share and the seconds its clock ran. Only hours
monitoring has finalised are measured. GPU ids here differ from MIG instance ids, on three clusters."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from pool_world import Fleet

from billing import measurements
from billing.measurements import MeteredUnit, clip_windows, measured_use
from capacity.models import MigInstance
from monitoring.models import Rollup1h, RollupRun, Series

pytestmark = pytest.mark.django_db
HOUR = datetime(2026, 3, 10, 9, tzinfo=UTC)


@pytest.fixture
def units(monkeypatch):
    fleet = Fleet()
    fleet.full_node("warm-up", gpus=3, cluster="c0")  # GPU ids run ahead of MIG instance ids
    whole = fleet.full_node("c1-full", gpus=1, cluster="c1").gpus.get()
    mig_node = fleet.mig_node("c2-mig", [["3g.40gb", "3g.40gb"]], cluster="c2")
    instance = MigInstance.objects.filter(gpu__node=mig_node).order_by("placement_start").first()
    # The whole GPU reports no power, only its energy counter: 1.8 MJ (0.5 kWh) over the hour.
    gpu_series = Series.objects.create(gpu=whole)
    Rollup1h.objects.create(
        series=gpu_series,
        bucket=HOUR,
        samples=120,
        sm_active_avg=60.0,
        power_w_avg=None,
        energy_mj_min=5_000_000,
        energy_mj_max=1_805_000_000,
    )
    # The MIG GPU draws 400 W; its instance has its own SM activity.
    Rollup1h.objects.create(
        series=Series.objects.create(gpu=instance.gpu), bucket=HOUR, samples=120, sm_active_avg=90.0, power_w_avg=400.0
    )
    Rollup1h.objects.create(
        series=Series.objects.create(gpu=instance.gpu, mig_instance=instance),
        bucket=HOUR,
        samples=120,
        sm_active_avg=30.0,
        power_w_avg=None,
    )
    RollupRun.objects.update_or_create(level="1h", defaults={"complete_until": HOUR + timedelta(hours=1)})
    trespassed = {}
    monkeypatch.setattr(measurements, "_trespass_seconds", lambda units, hour: trespassed)
    return {
        "whole": MeteredUnit(501, whole.pk, None, "full", share=Fraction(1), seconds=3600),
        "mig": MeteredUnit(502, instance.gpu_id, instance.pk, "mig", share=Fraction(1, 2), seconds=1800),
        "trespassed": trespassed,
    }


def test_sm_comes_from_the_units_own_series_and_energy_from_its_gpus_power_or_counter(units):
    measured = measured_use([units["whole"], units["mig"]], HOUR)

    assert measured == {
        501: measurements.Measured(sm_activity=Decimal("0.6000"), energy_kwh=Decimal("0.500000")),
        # 400 W for the 1,800 s its clock ran, half of the GPU: 0.1 kWh; SM of the instance, not of its GPU.
        502: measurements.Measured(sm_activity=Decimal("0.3000"), energy_kwh=Decimal("0.100000")),
    }


def test_the_counters_energy_follows_the_seconds_the_clock_ran_and_the_share():
    rollup = {"power_w_avg": None, "energy_mj_min": 1_000, "energy_mj_max": 7_201_000}  # 7,200 J over the hour
    unit = MeteredUnit(1, 1, None, "timeslice", share=Fraction(1, 4), seconds=900)

    assert measurements._energy_kwh(rollup, unit) == Decimal("0.000125")  # 7,200 J x 900/3600 x 1/4 = 450 J


def test_seconds_another_projects_pod_ran_on_the_unit_are_taken_off_its_sm_activity(units):
    units["trespassed"].update({501: 900, 502: 2700})  # a quarter of 3,600 s; more than the 1,800 s it ran

    measured = measured_use([units["whole"], units["mig"]], HOUR)

    assert measured[501].sm_activity == Decimal("0.4500")  # 60 % x (1 - 900/3600)
    assert measured[502].sm_activity == Decimal("0.0000")  # never below nothing
    assert (measured[501].energy_kwh, measured[502].energy_kwh) == (Decimal("0.500000"), Decimal("0.100000"))


def test_an_hour_is_measured_only_once_monitoring_has_finalised_it(units):
    RollupRun.objects.filter(level="1h").update(complete_until=HOUR)

    assert measured_use([units["whole"]], HOUR) == {}  # final only before 09:00
    assert set(measured_use([units["whole"]], HOUR - timedelta(hours=1))) == set()  # final, but no rollup then
    RollupRun.objects.filter(level="1h").update(complete_until=HOUR + timedelta(seconds=1))
    assert set(measured_use([units["whole"]], HOUR)) == {501}


def test_clip_windows_merges_a_window_into_the_last_one_it_overlaps_not_the_first():
    t = HOUR
    windows = [(t, t + timedelta(minutes=10)), (t + timedelta(minutes=20), t + timedelta(minutes=30))]
    windows.append((t + timedelta(minutes=25), t + timedelta(minutes=40)))

    assert clip_windows(windows, t, t + timedelta(hours=1)) == [
        (t, t + timedelta(minutes=10)),
        (t + timedelta(minutes=20), t + timedelta(minutes=40)),
    ]
