"""Where PostgreSQL and SQLite need different SQL on monitoring's hot paths: one module per backend, chosen once.

postgresql.py has the fast paths (COPY ingest, date_bin rollups, key-probe reads, ctid batches);
sqlite.py the ORM and Python versions for the embedded demo. Business code calls these names and
never asks which database it runs on.
"""

from __future__ import annotations

from django.db import connection

from . import postgresql, sqlite

_backend = postgresql if connection.vendor == "postgresql" else sqlite

insert_samples = _backend.insert_samples
delete_batch_sql = _backend.delete_batch_sql
rollup_5m = _backend.rollup_5m
rollup_1h = _backend.rollup_1h
sample_rows = _backend.sample_rows
samples_sql = _backend.samples_sql
raw_buckets = _backend.raw_buckets
latest_samples = _backend.latest_samples
pool_steps = _backend.pool_steps
