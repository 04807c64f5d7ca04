"""Where PostgreSQL and SQLite need different SQL on billing's hot paths: one module per backend, chosen once.

Business code calls these functions and never asks which database it runs on.
"""

from __future__ import annotations

from django.db import connection

from . import postgresql, sqlite

_backend = postgresql if connection.vendor == "postgresql" else sqlite

insert_usage_records = _backend.insert_usage_records
meter_plain_hour = _backend.meter_plain_hour
"""PostgreSQL: an hour of allocations without credits or measurements metered in SQL (METERS_IN_SQL)."""
METERS_IN_SQL = _backend.METERS_IN_SQL
