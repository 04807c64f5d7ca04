"""Retention: raw samples 7 days, 5-minute rollups 90 days, hourly kept (settings MONITORING_RETENTION_*).

Deletes in batches of MONITORING_RETENTION_BATCH rows, one short transaction each, so the job
never holds a long lock or builds a huge transaction; it stops after `max_batches` per table and
continues at the next run. PostgreSQL picks a batch by ctid (the primary key, which leads with ts,
finds the old rows), SQLite by rowid.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from monitoring import backends
from monitoring.models import Rollup1h, Rollup5m, Sample


def delete_older_than(model, column: str, cutoff: datetime, *, batch: int, max_batches: int) -> int:
    """Delete rows of `model` with `column` < cutoff, `batch` rows per transaction; rows deleted."""
    table = model._meta.db_table
    sql = backends.delete_batch_sql(table, column)
    deleted = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [cutoff, batch])
            count = cursor.rowcount
        deleted += count
        if count < batch:
            break
    return deleted


def prune(*, now: datetime | None = None, max_batches: int = 200) -> dict[str, int]:
    """Apply the retention settings; returns rows deleted per table. Idempotent."""
    now = now or timezone.now()
    batch = settings.MONITORING_RETENTION_BATCH
    result = {
        "raw": delete_older_than(
            Sample,
            "ts",
            now - timedelta(days=settings.MONITORING_RETENTION_RAW_DAYS),
            batch=batch,
            max_batches=max_batches,
        ),
        "5m": delete_older_than(
            Rollup5m,
            "bucket",
            now - timedelta(days=settings.MONITORING_RETENTION_5M_DAYS),
            batch=batch,
            max_batches=max_batches,
        ),
        "1h": 0,
    }
    if settings.MONITORING_RETENTION_1H_DAYS:
        result["1h"] = delete_older_than(
            Rollup1h,
            "bucket",
            now - timedelta(days=settings.MONITORING_RETENTION_1H_DAYS),
            batch=batch,
            max_batches=max_batches,
        )
    return result
