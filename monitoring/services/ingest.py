"""Writing samples: series ids for units, and bulk insert-or-ignore of sample rows.

A sample row is a tuple in `SAMPLE_COLUMNS` order (monitoring/models/); `sample_row()` builds one.
Duplicate and late samples are harmless: (ts, series_id) is the primary key and every path
ignores a row whose key exists. A poll's rows share one ts, so they append at the key's right edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from monitoring import backends
from monitoring.models import SAMPLE_COLUMNS, SAMPLE_PG_TYPES, Series

_INDEX = {name: i for i, name in enumerate(SAMPLE_COLUMNS)}
_INT_LIMITS = {"int2": 32767, "int4": 2147483647}


def slot(at: datetime, period_s: int) -> datetime:
    """`at` floored to a multiple of the poll period: a retried poll writes the same keys again."""
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % period_s, tz=UTC)


def sample_row(series_id: int, ts: datetime, values: dict) -> tuple:
    """A row tuple from column values; missing columns are None (unavailable). Counters are clamped."""
    row = [None] * len(SAMPLE_COLUMNS)
    row[_INDEX["series_id"]] = series_id
    row[_INDEX["ts"]] = ts
    for name, value in values.items():
        i = _INDEX[name]
        limit = _INT_LIMITS.get(SAMPLE_PG_TYPES[i])
        if limit is not None and value is not None:
            value = max(-limit, min(limit, int(value)))
        row[i] = value
    return tuple(row)


def series_ids(units: Iterable[tuple]) -> dict[tuple, int]:
    """Series id of each (gpu_id, mig_instance_id) or (gpu_id, None, vGPU mdev UUID), created when missing
    (see series_rows)."""
    return {unit: row[0] for unit, row in series_rows(units).items()}


def series_rows(units: Iterable[tuple]) -> dict[tuple, tuple[int, int | None, str]]:
    """(id, mem_total_mib, source) of the series of each unit, created when missing. A unit is
    (gpu_id, mig_instance_id) for a GPU or MIG instance, or (gpu_id, None, mdev UUID) for a vGPU.

    Idempotent and race-free: creation ignores conflicts on the partial unique constraints, then
    everything is re-read. One query when every series exists (the steady state of a poll).
    """
    wanted = set(units)
    if not wanted:
        return {}
    gpu_ids = sorted({u[0] for u in wanted})
    columns = ("id", "gpu_id", "mig_instance_id", "vgpu_uuid", "mem_total_mib", "source")

    def read() -> dict:
        return {
            ((g, m, v) if v else (g, m)): (pk, total, source)
            for pk, g, m, v, total, source in Series.objects.filter(gpu_id__in=gpu_ids).values_list(*columns)
        }

    found = read()
    missing = wanted - found.keys()
    if missing:
        Series.objects.bulk_create(
            [
                Series(gpu_id=u[0], mig_instance_id=u[1], vgpu_uuid=u[2] if len(u) > 2 else "")
                for u in sorted(missing, key=lambda u: (u[0], u[1] or 0, u[2] if len(u) > 2 else ""))
            ],
            ignore_conflicts=True,
        )
        found = read()
    return {unit: found[unit] for unit in wanted}


def ingest_samples(rows: Sequence[tuple], *, optimistic: bool = True) -> None:
    """Insert sample rows, ignoring any whose (ts, series_id) already exists. One transaction.

    The transaction does not wait for the WAL flush unless MONITORING_SYNCHRONOUS_COMMIT is on.
    PostgreSQL with at least MONITORING_COPY_MIN_ROWS rows: binary COPY straight into the table
    inside a savepoint (the common case: a batch never seen before); if a key already exists the
    savepoint is rolled back and the batch goes through a temporary staging table and
    INSERT ... SELECT ... ON CONFLICT DO NOTHING. `optimistic=False` always takes the staging path.
    Otherwise (small batches, SQLite): INSERT ... ON CONFLICT DO NOTHING via bulk_create. The SQL is
    monitoring.backends'.
    """
    if not rows:
        return
    backends.insert_samples(rows, optimistic=optimistic)
