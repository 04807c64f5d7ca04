"""SQLite (development and some tests): the ORM's own statements."""

from __future__ import annotations

from ..models import UsageRecord


def insert_usage_records(columns: tuple[str, ...], rows: list[tuple]) -> None:
    """bulk_create(ignore_conflicts=True): the same INSERT ... ON CONFLICT DO NOTHING."""
    UsageRecord.objects.bulk_create(
        [UsageRecord(**dict(zip(columns, row, strict=True))) for row in rows],
        batch_size=2000,
        ignore_conflicts=True,
    )


# Metering an hour in SQL is PostgreSQL's (billing.backends.postgresql); here every unit goes through Python.
METERS_IN_SQL = False


def meter_plain_hour(*args, **kwargs) -> int:
    """Never called on SQLite (METERS_IN_SQL is False): billing.services.metering meters each unit instead."""
    raise NotImplementedError("SQLite meters every unit in Python (billing.services.metering)")
