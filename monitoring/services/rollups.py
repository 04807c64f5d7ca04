"""5-minute and hourly rollups: avg/min/max per series per bucket, upserted (idempotent).

5-minute buckets are computed from raw samples, hourly buckets from the 5-minute rollups (averages
weighted by their sample counts). Recomputing a bucket overwrites it with the same or newer
figures, so late samples are picked up by re-rolling the last MONITORING_ROLLUP_LATENESS_S.
PostgreSQL does it in one INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE per range;
SQLite (the embedded demo) groups in Python and upserts with bulk_create(update_conflicts=True).
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from monitoring.choices import RollupLevel
from monitoring.models import Rollup1h, Rollup5m, RollupRun, Sample

BUCKET = {RollupLevel.FIVE_MINUTES: timedelta(minutes=5), RollupLevel.HOUR: timedelta(hours=1)}
GAUGES = ("power_w", "sm_active", "gpu_util", "mem_used_mib", "temp_c")
_ROLLUP_COLUMNS = [
    "samples",
    *[f"{g}_{agg}" for g in GAUGES for agg in ("avg", "min", "max")],
    "energy_mj_min",
    "energy_mj_max",
]
# First run, or after a long outage: roll up at most this far back (older raw data stays unrolled).
CATCH_UP = timedelta(days=1)


def floor(at: datetime, step: timedelta) -> datetime:
    seconds = int(step.total_seconds())
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def rollup_5m(start: datetime, end: datetime) -> int:
    """(Re)compute the 5-minute buckets in [start, end) (aligned outward) from raw samples; rows written."""
    start, end = floor(start, BUCKET["5m"]), _ceil(end, BUCKET["5m"])
    if connection.vendor == "postgresql":
        return _rollup_5m_sql(start, end)
    return _rollup_5m_python(start, end)


def rollup_1h(start: datetime, end: datetime) -> int:
    """(Re)compute the hourly buckets in [start, end) (aligned outward) from 5-minute rollups; rows written."""
    start, end = floor(start, BUCKET["1h"]), _ceil(end, BUCKET["1h"])
    if connection.vendor == "postgresql":
        return _rollup_1h_sql(start, end)
    return _rollup_1h_python(start, end)


def _ceil(at: datetime, step: timedelta) -> datetime:
    floored = floor(at, step)
    return floored if floored == at else floored + step


def _upsert_sql(table: str, select: str) -> str:
    """INSERT the grouped rows; a bucket already there is overwritten only if a figure changed
    (re-rolling an unchanged bucket writes nothing, so no dead tuples pile up)."""
    columns = ", ".join(_ROLLUP_COLUMNS)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _ROLLUP_COLUMNS)
    current = ", ".join(f"{table}.{c}" for c in _ROLLUP_COLUMNS)
    excluded = ", ".join(f"EXCLUDED.{c}" for c in _ROLLUP_COLUMNS)
    return (
        f"INSERT INTO {table} (series_id, bucket, {columns}) {select} "
        f"ON CONFLICT (series_id, bucket) DO UPDATE SET {updates} WHERE ({current}) IS DISTINCT FROM ({excluded})"
    )


# One backend, no JIT: every worker of a parallel aggregate would see every series (no reduction,
# three times the hashing), and JIT compilation costs more than it saves on these statements.
_SESSION = (
    "SET LOCAL max_parallel_workers_per_gather = 0",
    "SET LOCAL jit = off",
    "SET LOCAL work_mem = '128MB'",
)


def _execute(sql: str, params: list) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in _SESSION:
            cursor.execute(statement)
        cursor.execute(sql, params)
        return cursor.rowcount


def _rollup_5m_sql(start: datetime, end: datetime) -> int:
    aggregates = ", ".join(f"avg({g}), min({g}), max({g})" for g in GAUGES)
    select = (
        "SELECT series_id, date_bin('5 minutes', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00'), count(*), "
        f"{aggregates}, min(energy_mj), max(energy_mj) "
        f"FROM {Sample._meta.db_table} WHERE ts >= %s AND ts < %s GROUP BY 1, 2"
    )
    return _execute(_upsert_sql(Rollup5m._meta.db_table, select), [start, end])


def _rollup_1h_sql(start: datetime, end: datetime) -> int:
    def weighted(g: str) -> str:
        return (
            f"sum({g}_avg * samples) / nullif(sum(CASE WHEN {g}_avg IS NOT NULL THEN samples END), 0), "
            f"min({g}_min), max({g}_max)"
        )

    aggregates = ", ".join(weighted(g) for g in GAUGES)
    select = (
        "SELECT series_id, date_trunc('hour', bucket), sum(samples), "
        f"{aggregates}, min(energy_mj_min), max(energy_mj_max) "
        f"FROM {Rollup5m._meta.db_table} WHERE bucket >= %s AND bucket < %s GROUP BY 1, 2"
    )
    return _execute(_upsert_sql(Rollup1h._meta.db_table, select), [start, end])


class _Acc:
    """Running avg/min/max of one gauge; avg weighted (weight = sample count)."""

    __slots__ = ("total", "weight", "low", "high")

    def __init__(self):
        self.total, self.weight, self.low, self.high = 0.0, 0, None, None

    def add(self, value, weight: int = 1, low=None, high=None) -> None:
        if value is None:
            return
        self.total += value * weight
        self.weight += weight
        low = value if low is None else low
        high = value if high is None else high
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def values(self) -> tuple:
        avg = self.total / self.weight if self.weight else None
        return avg, self.low, self.high


def _write_python(model, groups: dict) -> int:
    rows = []
    for (series_id, bucket), (count, accs, energy) in groups.items():
        values = {"samples": count, "energy_mj_min": energy.low, "energy_mj_max": energy.high}
        for gauge, acc in zip(GAUGES, accs, strict=True):
            avg, low, high = acc.values()
            values.update({f"{gauge}_avg": avg, f"{gauge}_min": low, f"{gauge}_max": high})
        rows.append(model(series_id=series_id, bucket=bucket, **values))
    with transaction.atomic():
        model.objects.bulk_create(
            rows,
            batch_size=500,
            update_conflicts=True,
            unique_fields=["series", "bucket"],
            update_fields=_ROLLUP_COLUMNS,
        )
    return len(rows)


def _rollup_5m_python(start: datetime, end: datetime) -> int:
    groups: dict = {}
    step = BUCKET["5m"]
    rows = Sample.objects.filter(ts__gte=start, ts__lt=end).values_list("series_id", "ts", "energy_mj", *GAUGES)
    for series_id, ts, energy, *gauges in rows.iterator(chunk_size=5000):
        key = (series_id, floor(ts, step))
        group = groups.get(key)
        if group is None:
            group = groups[key] = [0, [_Acc() for _ in GAUGES], _Acc()]
        group[0] += 1
        for acc, value in zip(group[1], gauges, strict=True):
            acc.add(value)
        group[2].add(energy)
    return _write_python(Rollup5m, groups)


def _rollup_1h_python(start: datetime, end: datetime) -> int:
    groups: dict = defaultdict(lambda: [0, [_Acc() for _ in GAUGES], _Acc()])
    columns = [f"{g}_{agg}" for g in GAUGES for agg in ("avg", "min", "max")]
    rows = Rollup5m.objects.filter(bucket__gte=start, bucket__lt=end).values_list(
        "series_id", "bucket", "samples", "energy_mj_min", "energy_mj_max", *columns
    )
    for series_id, bucket, samples, energy_low, energy_high, *values in rows.iterator(chunk_size=5000):
        group = groups[(series_id, floor(bucket, BUCKET["1h"]))]
        group[0] += samples
        for i, acc in enumerate(group[1]):
            avg, low, high = values[3 * i : 3 * i + 3]
            acc.add(avg, samples, low, high)
        group[2].add(energy_low, 1, energy_low, energy_high)
    return _write_python(Rollup1h, groups)


def run_rollups(*, now: datetime | None = None) -> dict:
    """The beat job: roll up closed 5-minute buckets since the last run (minus the lateness margin),
    then the hours they touch; record progress in RollupRun. Idempotent; safe to run twice at once
    (both upsert the same figures)."""
    now = now or timezone.now()
    result = {}
    state_5m = RollupRun.objects.get_or_create(level=RollupLevel.FIVE_MINUTES)[0]
    end = floor(now - timedelta(seconds=settings.MONITORING_ROLLUP_GRACE_S), BUCKET["5m"])
    lateness = timedelta(seconds=settings.MONITORING_ROLLUP_LATENESS_S)
    start = max(state_5m.complete_until - lateness, end - CATCH_UP) if state_5m.complete_until else end - CATCH_UP
    result["5m"] = _run(state_5m, start, end, rollup_5m)

    state_1h = RollupRun.objects.get_or_create(level=RollupLevel.HOUR)[0]
    end_1h = floor(end, BUCKET["1h"])
    start_1h = (
        max(state_1h.complete_until - BUCKET["1h"], end_1h - CATCH_UP) if state_1h.complete_until else end_1h - CATCH_UP
    )
    result["1h"] = _run(state_1h, start_1h, end_1h, rollup_1h, partial_until=end)
    return result


def _run(state: RollupRun, start: datetime, end: datetime, fn, *, partial_until: datetime | None = None) -> dict:
    """Roll [start, end) (plus the open hour up to `partial_until`, never marked complete) and record it."""
    started = time.monotonic()
    state.last_started_at = timezone.now()
    rows = 0
    try:
        if start < end:
            rows += fn(start, end)
        if partial_until is not None and partial_until > end:
            rows += fn(end, partial_until)
    except Exception as exc:
        state.last_error = f"{type(exc).__name__}: {exc}"[:2000]
        state.save(update_fields=["last_started_at", "last_error"])
        raise
    state.complete_until = max(end, state.complete_until) if state.complete_until else end
    state.last_finished_at = timezone.now()
    state.last_duration_s = round(time.monotonic() - started, 3)
    state.last_rows = rows
    state.last_error = ""
    state.save()
    return {"start": start.isoformat(), "end": end.isoformat(), "rows": rows, "seconds": state.last_duration_s}
