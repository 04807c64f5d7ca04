"""Reading a few series' raw samples from a table keyed by (ts, series_id): every read path must
return exactly what a plain filter returns, whichever way it reads (key probes or a range scan)."""

from datetime import timedelta

import pytest
from django.db import connection
from monitoring_helpers import T0, every

from monitoring import readers
from monitoring.backends import postgresql as pg
from monitoring.models import Sample
from monitoring.readers import samples as sample_reads
from monitoring.services.ingest import ingest_samples, sample_row

pytestmark = pytest.mark.django_db

SERIES = range(1, 41)
START, END = T0 + timedelta(minutes=1), T0 + timedelta(minutes=4)


@pytest.fixture
def samples():
    """40 series polled every 30 s for 5 minutes, series 7 also at odd times, 9 only before START."""
    rows = [
        sample_row(sid, ts, {"sm_active": float(sid + i), "power_w": 100.0 + sid, "mem_used_mib": 10 * i})
        for i, ts in enumerate(every(T0, 10))
        for sid in SERIES
        if sid != 9 or ts < START
    ]
    rows += [sample_row(7, ts + timedelta(seconds=7), {"sm_active": 99.0}) for ts in every(T0, 10)]
    ingest_samples(rows)


def plain(ids, start, end, columns):
    rows = Sample.objects.filter(series_id__in=ids, ts__gte=start, ts__lt=end).order_by("series_id", "ts")
    return [tuple(r) for r in rows.values_list("series_id", "ts", *columns)]


@pytest.fixture(params=["probe", "many-series", "many-times"])
def read_mode(request, monkeypatch):
    """probe: key lookups; many-series / many-times: past a limit, the range is scanned instead."""
    if request.param == "many-series":
        monkeypatch.setattr(pg, "MAX_PROBED_SERIES", 2)
    if request.param == "many-times":
        monkeypatch.setattr(pg, "MAX_SLOTS", 3)
    return request.param


def test_sample_rows_equal_a_plain_filter_in_every_read_mode(samples, read_mode):
    columns = ("sm_active", "power_w", "mem_used_mib")
    ids = [3, 7, 9, 21, 40, 1000]  # 9 has nothing in range, 1000 does not exist
    rows = [tuple(r) for r in sample_reads.sample_rows(ids, START, END, columns)]
    assert rows == plain(ids, START, END, columns)
    # start is inclusive, end exclusive; series 7's odd-time samples are all there
    assert rows[0][1] == START and max(ts for _, ts, *_ in rows) < END
    assert sum(1 for sid, *_ in rows if sid == 7) == 12


def test_sample_rows_without_an_end_read_to_the_newest(samples, read_mode):
    rows = sample_reads.sample_rows([21], START)
    assert [ts for _, ts in rows] == every(START, 8)


def test_no_series_or_an_empty_range_read_nothing(samples):
    assert sample_reads.sample_rows([], START, END) == []
    assert sample_reads.sample_rows([3], END + timedelta(days=1), END + timedelta(days=2)) == []


@pytest.mark.postgres
def test_sample_slots_are_the_distinct_times_in_the_range(samples):
    expected = sorted({ts for ts in Sample.objects.filter(ts__gte=START, ts__lt=END).values_list("ts", flat=True)})
    assert pg.sample_slots(START, END) == expected
    assert len(expected) == 12  # 6 poll times plus series 7's 6 odd ones
    assert pg.sample_slots(END + timedelta(days=1)) == []


@pytest.mark.postgres
def test_a_few_series_are_read_by_key_probes_and_many_by_a_range_scan(samples):
    """The query plans behind the choice: key lookups for a few series, no lookups past the limit."""

    def plan(ids):
        sql, params = pg.samples_sql(ids, START, END, ("sm_active",))
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}", params)
            return "\n".join(line for (line,) in cursor.fetchall())

    assert "Index Cond: ((ts = t.ts) AND (series_id = i.id))" in plan([3, 7])
    assert "t.ts" not in plan(list(range(pg.MAX_PROBED_SERIES + 1)))


def test_latest_samples_are_the_newest_per_series_since(samples, read_mode):
    latest = readers.latest_samples([3, 7, 9, 1000], since=START)
    assert set(latest) == {3, 7}
    assert latest[3].ts == T0 + timedelta(seconds=270) and latest[3].sm_active == 12.0
    assert latest[7].ts == T0 + timedelta(seconds=277) and latest[7].sm_active == 99.0
    assert latest[3].power_w == 103.0 and latest[3].mem_used_mib == 90


def test_window_stats_raw_part_counts_every_sample_in_the_window(samples, read_mode):
    stats = readers.window_stats([3, 7, 9], START, END)
    assert stats[3].samples == 6 and stats[3].sm_active_avg == pytest.approx(sum(3.0 + i for i in range(2, 8)) / 6)
    assert stats[7].samples == 12 and stats[7].sm_active_max == 99.0
    assert stats[9].samples == 0 and stats[9].sm_active_avg is None
