"""Retention: raw 7 days, 5-minute 90 days, hourly kept; deleted in batches."""

from datetime import timedelta

import pytest
from monitoring_helpers import T0, series_of, write

from monitoring.models import Rollup1h, Rollup5m, Sample
from monitoring.services.retention import delete_older_than, prune

pytestmark = pytest.mark.django_db


def test_prune_applies_each_tables_retention(fleet, settings):
    settings.MONITORING_RETENTION_RAW_DAYS = 7
    settings.MONITORING_RETENTION_5M_DAYS = 90
    sid = series_of(fleet.full_gpu)
    now = T0 + timedelta(days=200)
    for age in (1, 6, 8, 30):
        write(sid, now - timedelta(days=age), sm_active=1.0)
    for age in (10, 89, 91, 150):
        Rollup5m.objects.create(series_id=sid, bucket=now - timedelta(days=age), samples=1)
        Rollup1h.objects.create(series_id=sid, bucket=now - timedelta(days=age), samples=1)
    assert prune(now=now) == {"raw": 2, "5m": 2, "1h": 0}
    assert sorted((now - ts).days for ts in Sample.objects.values_list("ts", flat=True)) == [1, 6]
    assert sorted((now - b).days for b in Rollup5m.objects.values_list("bucket", flat=True)) == [10, 89]
    assert Rollup1h.objects.count() == 4


def test_deletion_runs_in_batches_and_stops_at_the_limit(fleet):
    sid = series_of(fleet.full_gpu)
    for i in range(7):
        write(sid, T0 + timedelta(seconds=30 * i), sm_active=1.0)
    cutoff = T0 + timedelta(hours=1)
    assert delete_older_than(Sample, "ts", cutoff, batch=3, max_batches=2) == 6
    assert Sample.objects.count() == 1
    assert delete_older_than(Sample, "ts", cutoff, batch=3, max_batches=2) == 1
    assert Sample.objects.count() == 0


def test_hourly_retention_when_configured(fleet, settings):
    settings.MONITORING_RETENTION_1H_DAYS = 365
    sid = series_of(fleet.full_gpu)
    Rollup1h.objects.create(series_id=sid, bucket=T0 - timedelta(days=400), samples=1)
    Rollup1h.objects.create(series_id=sid, bucket=T0 - timedelta(days=300), samples=1)
    assert prune(now=T0)["1h"] == 1
