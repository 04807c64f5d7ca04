"""PostgreSQL: usage records in one INSERT ... SELECT FROM unnest(...) per chunk."""

from __future__ import annotations

from django.db import connection

from ..models import UsageRecord

# Array type of each UsageRecord column that metering writes, for unnest().
ARRAY_TYPES = {
    "allocation_id": "bigint[]",
    "hour": "timestamptz[]",
    "project_id": "bigint[]",
    "pool_id": "bigint[]",
    "kind": "varchar[]",
    "product": "varchar[]",
    "profile_name": "varchar[]",
    "replicas": "smallint[]",
    "seconds": "integer[]",
    "failed_credit_seconds": "integer[]",
    "health_credit_seconds": "integer[]",
    "hourly_rate": "numeric[]",
    "rate_card_id": "bigint[]",
    "sm_activity": "numeric[]",
    "energy_kwh": "numeric[]",
}
CHUNK = 10000


def insert_usage_records(columns: tuple[str, ...], rows: list[tuple]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING over unnest()ed column arrays.

    The ORM's bulk_create spends most of an hour's metering building model instances; this sends
    plain column arrays instead.
    """
    table = UsageRecord._meta.db_table
    arrays = ", ".join(f"%s::{ARRAY_TYPES[column]}" for column in columns)
    sql = f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start : start + CHUNK]
            cursor.execute(sql, [list(column) for column in zip(*chunk, strict=True)])
