"""PostgreSQL: usage records in one INSERT ... SELECT FROM unnest(...) per chunk; a whole hour of plain
running allocations metered in SQL (meter_plain_hour)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import connection, transaction

from ..choices import ALLOCATION_COLUMNS
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


METERS_IN_SQL = True

# Columns of the allocation query meter_plain_hour is given, in this order.
PLAIN_COLUMNS = (
    *ALLOCATION_COLUMNS,
    "node_replicas",
    "allocated_at",
    "released_at",
    "end_at",
)
# A spec as the allocation carries it (what its price depends on), then the record's spec and rate.
SPEC_COLUMNS = ("kind", "product", "profile_name", "node_replicas", "compute_slices")
PRICE_TYPES = (
    "varchar[]",
    "varchar[]",
    "varchar[]",
    "integer[]",
    "integer[]",
    "varchar[]",
    "varchar[]",
    "varchar[]",
    "smallint[]",
    "numeric[]",
)
PLAIN_TABLE = "billing_metering_plain"

# The clock of an allocation in [hour, end): from the later of its start and the hour to the earliest of its
# release, its request's end and the hour's end; whole seconds, truncated (clock.hour_figures, seconds_in).
_PLAIN_ROWS = f"""
CREATE TEMPORARY TABLE {PLAIN_TABLE} ON COMMIT DROP AS
SELECT s.id, s.project_id, s.pool_id, s.kind, s.product, s.profile_name, s.compute_slices, s.node_replicas,
       floor(EXTRACT(EPOCH FROM LEAST(COALESCE(s.released_at, %s::timestamptz),
                                      COALESCE(s.end_at, %s::timestamptz), %s::timestamptz)
                                - GREATEST(s.allocated_at, %s::timestamptz)))::integer AS seconds
FROM ({{rows}}) AS s({", ".join(PLAIN_COLUMNS)})
"""
_PLAIN_INSERT = f"""
WITH billed AS (
    SELECT p.id, p.project_id, p.pool_id, r.spec_kind, r.spec_product, r.spec_profile, r.spec_replicas, p.seconds,
           r.rate
    FROM {PLAIN_TABLE} p
    JOIN unnest({", ".join(f"%s::{t}" for t in PRICE_TYPES)})
        AS r(kind, product, profile_name, node_replicas, compute_slices,
             spec_kind, spec_product, spec_profile, spec_replicas, rate)
      ON r.kind = p.kind AND r.product = p.product AND r.profile_name = p.profile_name
     AND r.node_replicas IS NOT DISTINCT FROM p.node_replicas AND r.compute_slices = p.compute_slices
    WHERE p.seconds > 0
), written AS (
    INSERT INTO {UsageRecord._meta.db_table}
        (allocation_id, hour, project_id, pool_id, kind, product, profile_name, replicas, seconds,
         failed_credit_seconds, health_credit_seconds, hourly_rate, rate_card_id)
    SELECT id, %s::timestamptz, project_id, pool_id, spec_kind, spec_product, spec_profile, spec_replicas, seconds,
           0, 0, rate, %s::bigint
    FROM billed
    ON CONFLICT DO NOTHING
)
SELECT count(*) FROM billed
"""


def meter_plain_hour(
    rows_sql: str,
    rows_params: tuple,
    hour: datetime,
    end: datetime,
    price: Callable[[list[tuple]], list[tuple]],
    rate_card_id: int | None,
) -> int:
    """Meter `hour` for allocations without credits or measurements, in SQL; returns the rows offered.

    `rows_sql` selects PLAIN_COLUMNS of the allocations whose clock may run in [hour, end). Their rows are
    read once into a temporary table (one snapshot: the specs priced are exactly those inserted), the
    distinct specs (SPEC_COLUMNS) are priced by `price` (each spec tuple + record kind, product,
    profile_name, replicas, hourly rate), and every row with a second on the clock goes in with
    INSERT ... ON CONFLICT DO NOTHING, as insert_usage_records.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {PLAIN_TABLE}")
        cursor.execute(_PLAIN_ROWS.format(rows=rows_sql), (end, end, end, hour, *rows_params))
        cursor.execute(f"SELECT DISTINCT {', '.join(SPEC_COLUMNS)} FROM {PLAIN_TABLE} WHERE seconds > 0")
        specs = cursor.fetchall()
        if not specs:
            cursor.execute(f"DROP TABLE {PLAIN_TABLE}")
            return 0
        priced = price(specs)
        cursor.execute(_PLAIN_INSERT, (*(list(c) for c in zip(*priced, strict=True)), hour, rate_card_id))
        (offered,) = cursor.fetchone()
        cursor.execute(f"DROP TABLE {PLAIN_TABLE}")
    return offered
