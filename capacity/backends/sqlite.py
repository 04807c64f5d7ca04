"""SQLite (development and tests): upsert with bulk_create(update_conflicts=True), the same semantics."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import models


def upsert(
    model: type[models.Model], rows: list[dict], unique: Sequence[str], update: Sequence[str], key: str | None
) -> dict:
    """Insert `rows` or update `update` fields of those that conflict on `unique`; {row[key]: pk} when `key`."""
    objs = [model(**row) for row in rows]
    model._default_manager.bulk_create(
        objs,
        batch_size=500,
        update_conflicts=True,
        unique_fields=[_field_name(model, f) for f in unique],
        update_fields=[_field_name(model, f) for f in update],
    )
    return {getattr(obj, key): obj.pk for obj in objs} if key else {}


def _field_name(model, attname: str) -> str:
    return model._meta.get_field(attname).name
