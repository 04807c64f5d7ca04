"""Reading the raw samples of chosen series over a time range.

The sample table's key is (ts, series_id): a poll's rows share one ts, so ingestion appends at
the right edge of the index instead of descending into one key range per series (the ingest
benchmark's reason). The price is paid here. "Series 17 over the last 2 hours" is not a key
range any more, so on PostgreSQL a read of a few series goes in two steps:

1. the distinct sample times in the range, by a loose index scan (one index probe per time;
   every writer stamps samples with its poll slot, so a range holds few distinct times);
2. one key lookup per (time, series), as a LATERAL join that no statistics can turn into a scan.

A read of many series, or of a range with very many distinct times, scans the range instead.
SQLite (the embedded demo, small tables) always filters the range.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection

from .models import Sample

# A range with more distinct sample times than this is scanned (the key probes would not pay).
MAX_SLOTS = 20_000
# A read of more series than this scans the range: a key probe costs about ten scanned rows.
MAX_PROBED_SERIES = 1_000
# "No end": samples up to any time.
NO_END = datetime.max.replace(tzinfo=UTC)

_TABLE = Sample._meta.db_table

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
    if connection.vendor != "postgresql":
        marks = ", ".join(["%s"] * len(ids)) or "NULL"
        adapt = connection.ops.adapt_datetimefield_value  # stored as the ORM stores them
        return (
            f"SELECT {select} FROM {_TABLE} x WHERE x.series_id IN ({marks}) AND x.ts >= %s AND x.ts < %s",
            [*ids, adapt(start), adapt(end)],
        )
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


def sample_rows(series_ids, start: datetime, end: datetime = NO_END, columns=()) -> list[tuple]:
    """(series_id, ts, *columns) of `series_ids` in [start, end), ordered by series then time."""
    ids = list(series_ids)
    if not ids:
        return []
    if connection.vendor != "postgresql":
        rows = Sample.objects.filter(series_id__in=ids, ts__gte=start, ts__lt=end).order_by("series_id", "ts")
        return list(rows.values_list("series_id", "ts", *columns))
    sql, params = samples_sql(ids, start, end, columns)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH s AS MATERIALIZED ({sql}) SELECT * FROM s ORDER BY series_id, ts", params)
        return cursor.fetchall()
