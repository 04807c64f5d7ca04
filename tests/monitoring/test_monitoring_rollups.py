"""Rollups: avg/min/max per series per 5-minute and hourly bucket, against hand-computed values."""

from datetime import timedelta

import pytest
from monitoring_helpers import T0, series_of, write

from monitoring.choices import RollupLevel
from monitoring.models import Rollup1h, Rollup5m, RollupRun
from monitoring.services.rollups import rollup_1h, rollup_5m, run_rollups

pytestmark = pytest.mark.django_db


def _bucket(model, sid, at):
    return model.objects.get(series_id=sid, bucket=at)


@pytest.fixture
def gpu_series(fleet):
    """Two 5-minute buckets of one GPU: 10:00 (three samples) and 10:05 (one sample, power unavailable)."""
    sid = series_of(fleet.full_gpu)
    write(sid, T0, power_w=100.0, sm_active=10.0, gpu_util=10, mem_used_mib=1000, temp_c=40, energy_mj=1_000)
    write(
        sid,
        T0 + timedelta(seconds=30),
        power_w=200.0,
        sm_active=20.0,
        gpu_util=20,
        mem_used_mib=3000,
        temp_c=50,
        energy_mj=5_000,
    )
    write(
        sid,
        T0 + timedelta(seconds=270),
        power_w=300.0,
        sm_active=60.0,
        gpu_util=30,
        mem_used_mib=2000,
        temp_c=45,
        energy_mj=9_000,
    )
    write(
        sid,
        T0 + timedelta(minutes=5),
        power_w=None,
        sm_active=90.0,
        gpu_util=90,
        mem_used_mib=4000,
        temp_c=70,
        energy_mj=12_000,
    )
    return sid


def test_five_minute_buckets_hold_avg_min_max(gpu_series):
    assert rollup_5m(T0, T0 + timedelta(minutes=10)) == 2
    first = _bucket(Rollup5m, gpu_series, T0)
    assert first.samples == 3
    assert (first.power_w_avg, first.power_w_min, first.power_w_max) == (200.0, 100.0, 300.0)
    assert (first.sm_active_avg, first.sm_active_min, first.sm_active_max) == (30.0, 10.0, 60.0)
    assert (first.gpu_util_avg, first.gpu_util_min, first.gpu_util_max) == (20.0, 10.0, 30.0)
    assert (first.mem_used_mib_avg, first.mem_used_mib_min, first.mem_used_mib_max) == (2000.0, 1000, 3000)
    assert (first.temp_c_avg, first.temp_c_min, first.temp_c_max) == (45.0, 40, 50)
    assert (first.energy_mj_min, first.energy_mj_max) == (1_000, 9_000)
    second = _bucket(Rollup5m, gpu_series, T0 + timedelta(minutes=5))
    assert second.samples == 1
    assert (second.power_w_avg, second.power_w_min, second.power_w_max) == (None, None, None)
    assert second.sm_active_avg == 90.0


def test_hourly_buckets_weight_the_five_minute_averages(gpu_series):
    rollup_5m(T0, T0 + timedelta(hours=1))
    rollup_1h(T0, T0 + timedelta(hours=1))
    hour = _bucket(Rollup1h, gpu_series, T0)
    assert hour.samples == 4
    assert hour.sm_active_avg == pytest.approx((10 + 20 + 60 + 90) / 4)
    assert (hour.sm_active_min, hour.sm_active_max) == (10.0, 90.0)
    # power is unavailable in one sample: averaged over the three that have it
    assert hour.power_w_avg == pytest.approx(200.0)
    assert (hour.mem_used_mib_min, hour.mem_used_mib_max) == (1000, 4000)
    assert (hour.energy_mj_min, hour.energy_mj_max) == (1_000, 12_000)


def test_rollups_are_idempotent_and_pick_up_late_samples(gpu_series):
    rollup_5m(T0, T0 + timedelta(minutes=10))
    rollup_5m(T0, T0 + timedelta(minutes=10))
    assert Rollup5m.objects.count() == 2
    write(gpu_series, T0 + timedelta(seconds=90), power_w=400.0, sm_active=10.0)  # late sample
    rollup_5m(T0, T0 + timedelta(minutes=5))
    first = _bucket(Rollup5m, gpu_series, T0)
    assert first.samples == 4
    assert (first.power_w_avg, first.power_w_max) == (250.0, 400.0)
    assert first.sm_active_avg == 25.0


def test_mig_series_roll_up_separately(fleet):
    a, b = series_of(fleet.mig_gpu, fleet.mig_3g), series_of(fleet.mig_gpu, fleet.mig_1g)
    write(a, T0, sm_active=95.0, mem_used_mib=30000)
    write(b, T0, sm_active=25.0, mem_used_mib=5000)
    rollup_5m(T0, T0 + timedelta(minutes=5))
    assert _bucket(Rollup5m, a, T0).sm_active_avg == 95.0
    assert _bucket(Rollup5m, b, T0).sm_active_avg == 25.0
    assert _bucket(Rollup5m, a, T0).power_w_avg is None


def test_the_beat_job_rolls_closed_buckets_and_records_progress(gpu_series, settings):
    settings.MONITORING_ROLLUP_GRACE_S = 60
    now = T0 + timedelta(minutes=11)
    result = run_rollups(now=now)
    state = RollupRun.objects.get(level=RollupLevel.FIVE_MINUTES)
    assert state.complete_until == T0 + timedelta(minutes=10)
    assert result["5m"]["rows"] == 2
    assert Rollup1h.objects.get(series_id=gpu_series, bucket=T0).samples == 4  # the open hour, partial
    assert RollupRun.objects.get(level=RollupLevel.HOUR).complete_until == T0
    run_rollups(now=now)  # again: same rows
    assert Rollup5m.objects.count() == 2
    assert Rollup1h.objects.count() == 1
