"""Rollup buckets: their sizes, the gauges rolled up, and flooring times onto them (pure; no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .choices import RollupLevel

BUCKET = {RollupLevel.FIVE_MINUTES: timedelta(minutes=5), RollupLevel.HOUR: timedelta(hours=1)}
GAUGES = ("power_w", "sm_active", "gpu_util", "mem_used_mib", "temp_c")
# The figures of a rollup row (Rollup5m, Rollup1h) besides its series and bucket.
ROLLUP_COLUMNS = [
    "samples",
    *[f"{g}_{agg}" for g in GAUGES for agg in ("avg", "min", "max")],
    "energy_mj_min",
    "energy_mj_max",
]
# Buckets are aligned to this instant (PostgreSQL's date_bin origin).
ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)
# "No end": samples up to any time.
NO_END = datetime.max.replace(tzinfo=UTC)


def floor(at: datetime, step: timedelta) -> datetime:
    seconds = int(step.total_seconds())
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def ceil(at: datetime, step: timedelta) -> datetime:
    floored = floor(at, step)
    return floored if floored == at else floored + step


def plain_number(value):
    """avg() of an integer column comes back as Decimal: make it a float."""
    return float(value) if value is not None and not isinstance(value, int | float) else value
