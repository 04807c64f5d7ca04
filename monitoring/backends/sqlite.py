"""SQLite (the embedded demo, small tables) and the ORM paths: filter the range, group in Python."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Max, Q

from ..buckets import BUCKET, GAUGES, ROLLUP_COLUMNS, floor
from ..models import SAMPLE_COLUMNS, Rollup1h, Rollup5m, Sample

_TABLE = Sample._meta.db_table

# --- Reading samples ----------------------------------------------------------------------------


def samples_sql(series_ids, start: datetime, end: datetime, columns) -> tuple[str, list]:
    """A SELECT of (series_id, ts, *columns) for `series_ids` in [start, end), and its params: the range, filtered."""
    ids = list(series_ids)
    select = ", ".join(f"x.{c}" for c in ("series_id", "ts", *columns))
    marks = ", ".join(["%s"] * len(ids)) or "NULL"
    adapt = connection.ops.adapt_datetimefield_value  # stored as the ORM stores them
    return (
        f"SELECT {select} FROM {_TABLE} x WHERE x.series_id IN ({marks}) AND x.ts >= %s AND x.ts < %s",
        [*ids, adapt(start), adapt(end)],
    )


def sample_rows(series_ids: list[int], start: datetime, end: datetime, columns) -> list[tuple]:
    """(series_id, ts, *columns) of `series_ids` in [start, end), ordered by series then time."""
    rows = Sample.objects.filter(series_id__in=series_ids, ts__gte=start, ts__lt=end).order_by("series_id", "ts")
    return list(rows.values_list("series_id", "ts", *columns))


def raw_buckets(series_ids, start, end, size, aggregate, metrics) -> dict[int, list[dict]]:
    """Raw samples aggregated into buckets in Python (the part the rollup job has not finished yet)."""
    grouped: dict[tuple[int, datetime], list] = defaultdict(list)
    for sid, ts, *values in sample_rows(series_ids, start, end, metrics):
        grouped[(sid, floor(ts, size))].append(values)
    pick = {"avg": lambda v: sum(v) / len(v), "max": max, "min": min}[aggregate]
    result: dict[int, list[dict]] = defaultdict(list)
    for (sid, bucket), rows_ in sorted(grouped.items()):
        point = {"ts": bucket}
        for i, metric in enumerate(metrics):
            values = [r[i] for r in rows_ if r[i] is not None]
            point[metric] = pick(values) if values else None
        result[sid].append(point)
    return result


def latest_samples(series_ids: list[int], *, since: datetime) -> dict[int, Sample]:
    """The newest sample of each series since `since`: max(ts) per series, then those rows."""
    newest = (
        Sample.objects.filter(series_id__in=series_ids, ts__gte=since)
        .values("series_id")
        .annotate(ts=Max("ts"))
        .values_list("series_id", "ts")
    )
    keys = Q()
    for sid, ts in newest:
        keys |= Q(series_id=sid, ts=ts)
    if not keys:
        return {}
    return {row.series_id: row for row in Sample.objects.filter(keys)}


def pool_steps(units, start, end, step) -> list[tuple[datetime, float, int, float]]:
    """(ts, weighted avg, units, weight) per step, from each unit's series points, weighted in Python."""
    from monitoring.readers import series_points  # cycle: monitoring.readers calls this backend

    weights = {sid: w for sid, w, _, _ in units}
    windows: dict[int, list[tuple[datetime, datetime | None]]] = defaultdict(list)
    for sid, _, held_from, held_until in units:
        windows[sid].append((held_from, held_until))
    points = series_points(list(weights), start, end, step=step, metrics=("sm_active",), windows=windows)
    by_ts: dict[datetime, list[tuple[float, int]]] = defaultdict(list)
    for sid, rows in points.items():
        for p in rows:
            if p["sm_active"] is not None:
                by_ts[p["ts"]].append((p["sm_active"], weights[sid]))
    return [
        (ts, sum(v * w for v, w in vals) / sum(w for _, w in vals), len(vals), float(sum(w for _, w in vals)))
        for ts, vals in sorted(by_ts.items())
    ]


# --- Writing samples ----------------------------------------------------------------------------


def bulk_insert_samples(rows: Sequence[tuple]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING via bulk_create (no transaction of its own)."""
    Sample.objects.bulk_create(
        [Sample(**dict(zip(SAMPLE_COLUMNS, row, strict=True))) for row in rows],
        ignore_conflicts=True,
        batch_size=1000,
    )


def insert_samples(rows: Sequence[tuple], *, optimistic: bool = True) -> None:
    with transaction.atomic():
        bulk_insert_samples(rows)


def delete_batch_sql(table: str, column: str) -> str:
    """DELETE of up to %s rows of `table` with `column` < %s, picked by rowid."""
    return f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {column} < %s LIMIT %s)"


# --- Rollups: grouped in Python, upserted with bulk_create(update_conflicts=True) ----------------------------


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
            update_fields=ROLLUP_COLUMNS,
        )
    return len(rows)


def rollup_5m(start: datetime, end: datetime) -> int:
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


def rollup_1h(start: datetime, end: datetime) -> int:
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
