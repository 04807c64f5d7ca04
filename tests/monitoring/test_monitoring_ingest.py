"""Ingestion: insert-or-ignore on (series, ts), on both the small-batch and the COPY path."""

from datetime import timedelta

import pytest
from django.test import override_settings
from monitoring_helpers import T0, every

from monitoring.models import SAMPLE_COLUMNS, Sample, Series
from monitoring.services.ingest import ingest_samples, sample_row, series_ids, slot

pytestmark = pytest.mark.django_db


def _batch(fleet, times):
    ids = series_ids([(fleet.full_gpu.pk, None), (fleet.mig_gpu.pk, fleet.mig_3g.pk)])
    gpu, mig = ids[(fleet.full_gpu.pk, None)], ids[(fleet.mig_gpu.pk, fleet.mig_3g.pk)]
    rows = []
    for i, ts in enumerate(times):
        rows.append(sample_row(gpu, ts, {"power_w": 300.5 + i, "sm_active": 50.0, "ecc_dbe_vol": 0, "temp_c": 60}))
        rows.append(sample_row(mig, ts, {"sm_active": 95.0, "mem_used_mib": 20000}))
    return rows


def test_series_ids_are_created_once_and_stable(fleet):
    units = [(fleet.full_gpu.pk, None), (fleet.mig_gpu.pk, fleet.mig_3g.pk), (fleet.mig_gpu.pk, fleet.mig_2g.pk)]
    first = series_ids(units)
    again = series_ids(units + [(fleet.mig_gpu.pk, None)])
    assert {k: again[k] for k in first} == first
    assert Series.objects.count() == 4
    assert Series.objects.get(pk=first[(fleet.mig_gpu.pk, fleet.mig_3g.pk)]).mig_instance == fleet.mig_3g


def test_same_batch_twice_gives_the_same_rows(fleet):
    rows = _batch(fleet, every(T0, 3))
    ingest_samples(rows)
    ingest_samples(rows)
    assert Sample.objects.count() == 6
    stored = sorted(Sample.objects.values_list(*[c for c in SAMPLE_COLUMNS]))
    assert stored == sorted(rows)


def test_overlapping_late_batch_only_adds_new_keys(fleet):
    ingest_samples(_batch(fleet, every(T0, 3)))
    late = _batch(fleet, every(T0 + timedelta(seconds=60), 3))  # first time overlaps
    late[0] = late[0][:3] + (999.0,) + late[0][4:]  # a different value for an existing key is ignored
    ingest_samples(late)
    assert Sample.objects.count() == 10
    first_gpu = Sample.objects.get(series_id=late[0][2], ts=late[0][0])
    assert first_gpu.power_w == 302.5


def test_unavailable_values_are_null_not_zero(fleet):
    ingest_samples(_batch(fleet, [T0]))
    mig = Sample.objects.get(series__mig_instance=fleet.mig_3g)
    assert (mig.power_w, mig.temp_c, mig.ecc_dbe_vol, mig.gpu_util) == (None, None, None, None)
    gpu = Sample.objects.get(series__gpu=fleet.full_gpu, series__mig_instance__isnull=True)
    assert (gpu.ecc_dbe_vol, gpu.gpu_util) == (0, None)


@pytest.mark.postgres
@override_settings(MONITORING_COPY_MIN_ROWS=1)
def test_copy_path_ignores_duplicates_and_keeps_the_transaction_usable(fleet):
    rows = _batch(fleet, every(T0, 5))
    ingest_samples(rows)
    ingest_samples(rows + _batch(fleet, [T0 + timedelta(minutes=10)]))  # savepoint fallback to staging
    ingest_samples(_batch(fleet, [T0 + timedelta(minutes=20)]), optimistic=False)
    assert Sample.objects.count() == 14


def test_slot_floors_to_the_poll_period():
    assert slot(T0 + timedelta(seconds=47), 30) == T0 + timedelta(seconds=30)
    assert slot(T0, 30) == T0


def test_counters_beyond_the_column_range_are_clamped(fleet):
    sid = series_ids([(fleet.full_gpu.pk, None)])[(fleet.full_gpu.pk, None)]
    row = sample_row(sid, T0, {"ecc_sbe_agg": 10**12, "remap_corr": 10**6})
    ingest_samples([row])
    sample = Sample.objects.get()
    assert (sample.ecc_sbe_agg, sample.remap_corr) == (2147483647, 32767)
