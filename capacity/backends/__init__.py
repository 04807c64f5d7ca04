"""Where PostgreSQL and SQLite need different SQL on capacity's hot paths: one module per backend, chosen once.

Business code calls these names (through capacity.services.bulk) and never asks which database it runs on.
"""

from __future__ import annotations

from django.db import connection

from . import postgresql, sqlite

_backend = postgresql if connection.vendor == "postgresql" else sqlite

upsert = _backend.upsert
