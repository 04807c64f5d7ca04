"""Reading the raw samples of chosen series over a time range (monitoring.backends does the reading).

The sample table's key is (ts, series_id), so "series 17 over the last 2 hours" is not a key
range: on PostgreSQL a read of a few series probes the key per (time, series) instead of scanning
(monitoring/backends/postgresql.py says how); SQLite filters the range.
"""

from __future__ import annotations

from datetime import datetime

from .. import backends
from ..buckets import NO_END


def sample_rows(series_ids, start: datetime, end: datetime = NO_END, columns=()) -> list[tuple]:
    """(series_id, ts, *columns) of `series_ids` in [start, end), ordered by series then time."""
    ids = list(series_ids)
    if not ids:
        return []
    return backends.sample_rows(ids, start, end, columns)
