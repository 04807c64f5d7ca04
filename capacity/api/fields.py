"""Serializer fields whose OpenAPI schema says exactly what their validation takes, shared by the
capacity and operations APIs (a schema that offers more than the server takes is a 400 to a client
that trusted it)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from capacity.mig.catalog import PRODUCTS

# 00:00 to 23:59, seconds and microseconds optional: what DRF's TimeField parses ("24:00" and "12:60" are 400).
WALL_CLOCK_TIME_PATTERN = r"^([01]\d|2[0-3]):[0-5]\d(:[0-5]\d(\.\d{1,6})?)?$"


@extend_schema_field({"type": "string", "enum": sorted(PRODUCTS), "example": "H100-80GB"})
class CatalogProductField(serializers.CharField):
    """A GPU product by its catalog key (capacity.mig.catalog.PRODUCTS). The validators that resolve
    it (the model's clean(), get_product) also take GFD's product names; the schema offers the keys."""


@extend_schema_field({"type": "string", "pattern": WALL_CLOCK_TIME_PATTERN, "example": "02:00:00"})
class WallClockTimeField(serializers.TimeField):
    """A time of day without offset ("02:00:00", UTC by convention). OpenAPI's `format: time` is
    RFC 3339's full-time, which demands an offset that DRF neither writes nor needs: so a pattern."""
