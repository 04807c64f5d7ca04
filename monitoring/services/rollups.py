"""5-minute and hourly rollups: avg/min/max per series per bucket, upserted (idempotent).

5-minute buckets are computed from raw samples, hourly buckets from the 5-minute rollups (averages
weighted by their sample counts). Recomputing a bucket overwrites it with the same or newer
figures, so late samples are picked up by re-rolling the last MONITORING_ROLLUP_LATENESS_S.
PostgreSQL does it in one INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE per range;
SQLite (the embedded demo) groups in Python and upserts with bulk_create(update_conflicts=True)
(monitoring.backends).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from monitoring import backends
from monitoring.buckets import BUCKET, ceil, floor
from monitoring.choices import RollupLevel
from monitoring.models import RollupRun

# First run, or after a long outage: roll up at most this far back (older raw data stays unrolled).
CATCH_UP = timedelta(days=1)


def rollup_5m(start: datetime, end: datetime) -> int:
    """(Re)compute the 5-minute buckets in [start, end) (aligned outward) from raw samples; rows written."""
    start, end = floor(start, BUCKET["5m"]), ceil(end, BUCKET["5m"])
    return backends.rollup_5m(start, end)


def rollup_1h(start: datetime, end: datetime) -> int:
    """(Re)compute the hourly buckets in [start, end) (aligned outward) from 5-minute rollups; rows written."""
    start, end = floor(start, BUCKET["1h"]), ceil(end, BUCKET["1h"])
    return backends.rollup_1h(start, end)


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
