"""PostgreSQL: the monitoring hot paths in SQL (COPY, date_bin, DISTINCT ON, key probes, ctid batches).

Reading a few series: the sample table's key is (ts, series_id): a poll's rows share one ts, so
ingestion appends at the right edge of the index instead of descending into one key range per
series (the ingest benchmark's reason). The price is paid here. "Series 17 over the last 2 hours"
is not a key range any more, so a read of a few series goes in two steps:

1. the distinct sample times in the range, by a loose index scan (one index probe per time;
   every writer stamps samples with its poll slot, so a range holds few distinct times);
2. one key lookup per (time, series), as a LATERAL join that no statistics can turn into a scan.

A read of many series, or of a range with very many distinct times, scans the range instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from psycopg import errors as pg_errors

from ..buckets import BUCKET, GAUGES, NO_END, ORIGIN, ROLLUP_COLUMNS, floor, plain_number
from ..choices import RollupLevel
from ..models import SAMPLE_COLUMNS, SAMPLE_PG_TYPES, Rollup1h, Rollup5m, RollupRun, Sample
from .sqlite import bulk_insert_samples

_TABLE = Sample._meta.db_table
_COLUMNS_SQL = ", ".join(SAMPLE_COLUMNS)
_STAGE = "monitoring_sample_stage"

# --- Reading samples ----------------------------------------------------------------------------

# A range with more distinct sample times than this is scanned (the key probes would not pay).
MAX_SLOTS = 20_000
# A read of more series than this scans the range: a key probe costs about ten scanned rows.
MAX_PROBED_SERIES = 1_000

# Each step is ORDER BY ... LIMIT 1 rather than min(): the planner then always walks the index,
# even when stale statistics make it believe the range is empty.
_SLOTS_SQL = (
    "WITH RECURSIVE slots(ts) AS ("
    f"(SELECT ts FROM {_TABLE} WHERE ts >= %(start)s AND ts < %(end)s ORDER BY ts LIMIT 1) "
    f"UNION ALL SELECT (SELECT s.ts FROM {_TABLE} s WHERE s.ts > slots.ts AND s.ts < %(end)s "
    "ORDER BY s.ts LIMIT 1) FROM slots WHERE slots.ts IS NOT NULL) "
    "SELECT ts FROM slots WHERE ts IS NOT NULL LIMIT %(limit)s"
)


def sample_slots(start: datetime, end: datetime = NO_END) -> list[datetime] | None:
    """The distinct sample times in [start, end), oldest first (PostgreSQL); None past MAX_SLOTS."""
    with connection.cursor() as cursor:
        cursor.execute(_SLOTS_SQL, {"start": start, "end": end, "limit": MAX_SLOTS + 1})
        slots = [ts for (ts,) in cursor.fetchall()]
    return slots if len(slots) <= MAX_SLOTS else None


def samples_sql(series_ids, start: datetime, end: datetime, columns) -> tuple[str, list]:
    """A SELECT of (series_id, ts, *columns) for `series_ids` in [start, end), and its params.

    Use it as `WITH s AS MATERIALIZED (...)`, so that a join outside cannot undo the key probes.
    """
    ids = list(series_ids)
    select = ", ".join(f"x.{c}" for c in ("series_id", "ts", *columns))
    slots = sample_slots(start, end) if len(ids) <= MAX_PROBED_SERIES else None
    if slots is None:
        return (
            f"SELECT {select} FROM {_TABLE} x "
            "WHERE x.ts >= %s AND x.ts < %s AND x.series_id IN (SELECT unnest(%s::int[]))",
            [start, end, ids],
        )
    return (
        f"SELECT {select} FROM unnest(%s::timestamptz[]) t(ts) CROSS JOIN unnest(%s::int[]) i(id) "
        f"CROSS JOIN LATERAL (SELECT * FROM {_TABLE} WHERE ts = t.ts AND series_id = i.id LIMIT 1) x",
        [slots, ids],
    )


def sample_rows(series_ids: list[int], start: datetime, end: datetime, columns) -> list[tuple]:
    """(series_id, ts, *columns) of `series_ids` in [start, end), ordered by series then time."""
    sql, params = samples_sql(series_ids, start, end, columns)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH s AS MATERIALIZED ({sql}) SELECT * FROM s ORDER BY series_id, ts", params)
        return cursor.fetchall()


def raw_buckets(series_ids, start, end, size, aggregate, metrics) -> dict[int, list[dict]]:
    """Raw samples aggregated into buckets in SQL (the part the rollup job has not finished yet)."""
    columns = ", ".join(f"{aggregate}({m})" for m in metrics)
    result: dict[int, list[dict]] = defaultdict(list)
    samples, params = samples_sql(series_ids, start, end, metrics)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH s AS MATERIALIZED ({samples}) "
            f"SELECT series_id, date_bin(%s, ts, %s), {columns} FROM s GROUP BY 1, 2 ORDER BY 1, 2",
            [*params, size, ORIGIN],
        )
        for sid, bucket, *values in cursor.fetchall():
            result[sid].append({"ts": bucket, **{m: plain_number(v) for m, v in zip(metrics, values, strict=True)}})
    return result


def latest_samples(series_ids: list[int], *, since: datetime) -> dict[int, Sample]:
    """The newest sample of each series since `since`: DISTINCT ON over the key probes."""
    others = tuple(c for c in SAMPLE_COLUMNS if c not in ("series_id", "ts"))
    samples, params = samples_sql(series_ids, since, NO_END, others)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH s AS MATERIALIZED ({samples}) SELECT DISTINCT ON (series_id) * FROM s ORDER BY series_id, ts DESC",
            params,
        )
        rows = [Sample(series_id=sid, ts=ts, **dict(zip(others, values, strict=True))) for sid, ts, *values in cursor]
    return {row.series_id: row for row in rows}


_UNITS_CTE = (
    "WITH u (series_id, w, held_from, held_until) AS "
    "(SELECT * FROM unnest(%s::int[], %s::int[], %s::timestamptz[], %s::timestamptz[]))"
)


def pool_steps(units, start, end, step) -> list[tuple[datetime, float, int, float]]:
    """(ts, weighted avg, units, weight) per step: finished rollups, then raw samples binned in SQL."""
    if not units:
        return []
    params = [[u[0] for u in units], [u[1] for u in units], [u[2] for u in units], [u[3] for u in units]]
    rows: list[tuple] = []
    with connection.cursor() as cursor:
        if step == "raw":
            samples, samples_params = samples_sql(params[0], start, end, ("sm_active",))
            cursor.execute(
                f"{_UNITS_CTE}, s AS MATERIALIZED ({samples}) "
                "SELECT s.ts, sum(s.sm_active * u.w) / sum(u.w), count(*), sum(u.w) "
                "FROM s JOIN u ON s.series_id = u.series_id WHERE s.ts >= u.held_from "
                "AND (u.held_until IS NULL OR s.ts < u.held_until) AND s.sm_active IS NOT NULL "
                "GROUP BY s.ts ORDER BY s.ts",
                [*params, *samples_params],
            )
            return [(ts, float(avg), n, float(w)) for ts, avg, n, w in cursor.fetchall()]
        size = BUCKET[step]
        start = floor(start, size)
        done = RollupRun.finished_until(step)
        rolled_end = min(end, done) if done else start
        if rolled_end > start:
            table = (Rollup5m if step == RollupLevel.FIVE_MINUTES else Rollup1h)._meta.db_table
            cursor.execute(
                f"{_UNITS_CTE} SELECT r.bucket, sum(r.sm_active_avg * u.w) / sum(u.w), count(*), sum(u.w) "
                f"FROM {table} r JOIN u ON r.series_id = u.series_id "
                "WHERE r.bucket >= %s AND r.bucket < %s AND r.bucket >= u.held_from "
                "AND (u.held_until IS NULL OR r.bucket + %s <= u.held_until) AND r.sm_active_avg IS NOT NULL "
                "GROUP BY r.bucket ORDER BY r.bucket",
                [*params, start, rolled_end, size],
            )
            rows += cursor.fetchall()
        tail = max(start, rolled_end)
        if tail < end:
            samples, samples_params = samples_sql(params[0], tail, end, ("sm_active",))
            cursor.execute(
                f"{_UNITS_CTE}, s AS MATERIALIZED ({samples}), per_unit AS ("
                "SELECT date_bin(%s, s.ts, %s) AS bucket, avg(s.sm_active) AS v, u.w "
                "FROM s JOIN u ON s.series_id = u.series_id WHERE s.ts >= u.held_from "
                "AND (u.held_until IS NULL OR s.ts < u.held_until) AND s.sm_active IS NOT NULL "
                "GROUP BY 1, s.series_id, u.w) "
                "SELECT bucket, sum(v * w) / sum(w), count(*), sum(w) FROM per_unit GROUP BY bucket ORDER BY bucket",
                [*params, *samples_params, size, ORIGIN],
            )
            rows += cursor.fetchall()
    return [(ts, float(avg), n, float(w)) for ts, avg, n, w in rows]


# --- Writing samples ----------------------------------------------------------------------------


def insert_samples(rows: Sequence[tuple], *, optimistic: bool = True) -> None:
    """At least MONITORING_COPY_MIN_ROWS rows: binary COPY (see _copy_samples); fewer: bulk_create. One transaction."""
    if len(rows) >= settings.MONITORING_COPY_MIN_ROWS:
        _copy_samples(rows, optimistic=optimistic)
        return
    with transaction.atomic():
        relax_commit()
        bulk_insert_samples(rows)


def relax_commit() -> None:
    """Samples are telemetry: unless MONITORING_SYNCHRONOUS_COMMIT, their transaction does not wait for the
    WAL flush (a crash may lose the last fraction of a second of samples; nothing else is affected)."""
    if not settings.MONITORING_SYNCHRONOUS_COMMIT:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")


def _copy(cursor, table: str, rows: Sequence[tuple]) -> None:
    with cursor.copy(f"COPY {table} ({_COLUMNS_SQL}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(SAMPLE_PG_TYPES)
        for row in rows:
            copy.write_row(row)


def _copy_samples(rows: Sequence[tuple], *, optimistic: bool) -> None:
    table = Sample._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        relax_commit()
        if optimistic:
            try:
                with transaction.atomic():
                    _copy(cursor, table, rows)
                return
            except pg_errors.UniqueViolation:
                pass  # some keys exist: the savepoint is rolled back, take the conflict-tolerant path
        cursor.execute(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGE} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
        _copy(cursor, _STAGE, rows)
        cursor.execute(
            f"INSERT INTO {table} ({_COLUMNS_SQL}) SELECT {_COLUMNS_SQL} FROM {_STAGE} "
            "ON CONFLICT (ts, series_id) DO NOTHING"
        )
        cursor.execute(f"TRUNCATE {_STAGE}")


def delete_batch_sql(table: str, column: str) -> str:
    """DELETE of up to %s rows of `table` with `column` < %s, picked by ctid (the key, leading with ts, finds them)."""
    return f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {column} < %s LIMIT %s))"


# --- Rollups: one INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE per range -------------------------


def _upsert_sql(table: str, select: str) -> str:
    """INSERT the grouped rows; a bucket already there is overwritten only if a figure changed
    (re-rolling an unchanged bucket writes nothing, so no dead tuples pile up)."""
    columns = ", ".join(ROLLUP_COLUMNS)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in ROLLUP_COLUMNS)
    current = ", ".join(f"{table}.{c}" for c in ROLLUP_COLUMNS)
    excluded = ", ".join(f"EXCLUDED.{c}" for c in ROLLUP_COLUMNS)
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


def rollup_5m(start: datetime, end: datetime) -> int:
    aggregates = ", ".join(f"avg({g}), min({g}), max({g})" for g in GAUGES)
    select = (
        "SELECT series_id, date_bin('5 minutes', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00'), count(*), "
        f"{aggregates}, min(energy_mj), max(energy_mj) "
        f"FROM {Sample._meta.db_table} WHERE ts >= %s AND ts < %s GROUP BY 1, 2"
    )
    return _execute(_upsert_sql(Rollup5m._meta.db_table, select), [start, end])


def rollup_1h(start: datetime, end: datetime) -> int:
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
