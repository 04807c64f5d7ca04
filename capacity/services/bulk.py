"""Bulk upserts for the capacity mirror: INSERT ... ON CONFLICT (key) DO UPDATE, fast on PostgreSQL.

A first discovery writes tens of thousands of rows (2,000 nodes, 16,000 GPUs, 37,000 MIG instances
in the scale scenario). Django's bulk_create(update_conflicts=True) builds a model instance and
prepares every value in Python, then psycopg escapes every string into arrays: about 10 s for those
rows on the benchmark machine. On PostgreSQL, `upsert()` instead COPYs plain tuples into a
temporary table and merges them with one INSERT ... SELECT ... ON CONFLICT DO UPDATE ... RETURNING,
about 20 times faster. Other databases (SQLite in development and tests) use bulk_create with the
same semantics (capacity.backends).

Rows are dicts keyed by attribute name ("node_id", not "node"); callers must not repeat a key
within one call (PostgreSQL refuses to update one row twice in a statement).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import models

from capacity import backends


def upsert(
    model: type[models.Model],
    rows: list[dict],
    *,
    unique: Sequence[str],
    update: Sequence[str],
    key: str | None = None,
) -> dict:
    """Insert `rows` or update `update` fields of the rows that conflict on `unique`.

    Returns {row[key]: pk} of every row written when `key` is given, else {}.
    """
    if not rows:
        return {}
    return backends.upsert(model, rows, unique, update, key)
