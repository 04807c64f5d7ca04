"""Writing many rows fast for the fleet world: PostgreSQL COPY (Copier), the next free ids, sequences reset after a
COPY, and ANALYZE."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from django.db import connection
from django.db.models import NOT_PROVIDED, JSONField


def _text(value) -> str:
    if value is None:
        return "\\N"
    if value is True:
        return "t"
    if value is False:
        return "f"
    return str(value)


class Copier:
    """COPY rows of a model's table from Python tuples (psycopg 3 `cursor.copy`).

    Columns the caller does not give are filled with the model field's default (or NULL where the
    field is nullable), rendered once, so each row costs one join of its own values."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def copy(self, model, fields: tuple[str, ...], rows: Iterable[tuple]) -> int:
        opts = model._meta
        given = [opts.get_field(name) for name in fields]
        columns = [f.column for f in given]
        extra_columns, extra_values = [], []
        for f in opts.concrete_fields:
            if f.column in columns or f.null or f.primary_key or f.db_default is not NOT_PROVIDED:
                continue
            value = f.get_default()  # "" for a string field without one
            if value is None:
                raise ValueError(f"{opts.label}.{f.name} has no default: give it")
            extra_columns.append(f.column)
            extra_values.append(json.dumps(value) if isinstance(f, JSONField) else _text(value))
        suffix = "".join("\t" + v for v in extra_values) + "\n"
        names = ", ".join(f'"{c}"' for c in columns + extra_columns)
        started = time.perf_counter()
        n = 0
        with connection.cursor() as cursor:
            raw = cursor.cursor  # the psycopg 3 cursor under Django's wrapper
            with raw.copy(f'COPY "{opts.db_table}" ({names}) FROM STDIN') as copy:
                chunk: list[str] = []
                for row in rows:
                    chunk.append("\t".join(map(_text, row)) + suffix)
                    n += 1
                    if len(chunk) >= 20_000:
                        copy.write("".join(chunk))
                        chunk = []
                if chunk:
                    copy.write("".join(chunk))
        self.counts[opts.db_table] = self.counts.get(opts.db_table, 0) + n
        self.seconds[opts.db_table] = self.seconds.get(opts.db_table, 0.0) + time.perf_counter() - started
        return n


def next_id(model) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT COALESCE(MAX(id), 0) + 1 FROM "{model._meta.db_table}"')
        return cursor.fetchone()[0]


def reset_sequences(models) -> None:
    with connection.cursor() as cursor:
        for model in models:
            table = model._meta.db_table
            highest = f'(SELECT COALESCE(MAX(id), 1) FROM "{table}")'
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('\"{table}\"', 'id'), {highest})")


def analyze(models) -> None:
    """Planner statistics and the visibility map, as autovacuum would have them in production (ANALYZE
    alone inside a transaction, e.g. a test's, where VACUUM cannot run)."""
    command = "ANALYZE" if connection.in_atomic_block else "VACUUM ANALYZE"
    with connection.cursor() as cursor:
        for model in models:
            cursor.execute(f'{command} "{model._meta.db_table}"')
