"""Strict API input, shared by every app's API.

Write serializers refuse what they do not know: a body key that is not one of the serializer's
fields is a 400 naming it, instead of being dropped silently (a typo such as `cout: 4` must not
create a request for the default count).

Lives in capacity, the lowest app, so that every app's API can use it (capacity <- pools <-
monitoring/billing <- gpuaas). The schema says the same thing: request bodies of these serializers
carry `additionalProperties: false` (see core.api.ApiAutoSchema).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC

from django.core.exceptions import ValidationError as FormValidationError
from django_filters import fields as filter_fields
from django_filters import rest_framework as filters
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

UNKNOWN_FIELD = "Unknown field."
# Not data: the CSRF token that the browsable API's HTML forms post along with the fields.
NOT_FIELDS = frozenset({"csrfmiddlewaretoken"})


def unknown_fields(serializer: serializers.Serializer, data) -> list[str]:
    """Keys of `data` that are none of the serializer's fields (read-only fields are known: a client
    may send back what it read)."""
    if not isinstance(data, Mapping):
        return []
    return sorted(str(key) for key in data if key not in serializer.fields and key not in NOT_FIELDS)


NOT_AN_ID = "Give an id (or null), not an empty string."
NOT_A_STRING = "Not a valid string."
NOT_A_BOOLEAN = "Must be true or false."


class StrictFieldsMixin:
    """Mix into a Serializer/ModelSerializer (first base) that takes request bodies."""

    def to_internal_value(self, data):
        refused = {name: [UNKNOWN_FIELD] for name in unknown_fields(self, data)}
        # DRF reads "" as null for a relation (an HTML form's empty select); in JSON it is a string
        # where the schema takes an id or null.
        if isinstance(data, Mapping):
            refused.update(
                {
                    name: [NOT_AN_ID]
                    for name, field in self.fields.items()
                    if isinstance(field, serializers.RelatedField) and data.get(name) == ""
                }
            )
            # DRF's CharField takes a number and stores its text ({"name": 1e16} becomes "1e+16"); the schema
            # says string, so a number, list or object there is refused.
            refused.update(
                {
                    name: [NOT_A_STRING]
                    for name, field in self.fields.items()
                    if isinstance(field, serializers.CharField)
                    and not field.read_only
                    and name in data
                    and data[name] is not None
                    and not isinstance(data[name], str)
                }
            )
            # DRF's BooleanField also takes 0, 1, "yes" and "on"; a JSON body's boolean is true or false (an
            # HTML form's fields are text, so only parsed JSON is held to it).
            if not hasattr(data, "getlist"):
                refused.update(
                    {
                        name: [NOT_A_BOOLEAN]
                        for name, field in self.fields.items()
                        if isinstance(field, serializers.BooleanField)
                        and not field.read_only
                        and name in data
                        and not isinstance(data[name], bool)
                        and not (data[name] is None and field.allow_null)
                    }
                )
        try:
            value = super().to_internal_value(data)
        except ValidationError as exc:
            if refused and isinstance(exc.detail, Mapping):
                raise ValidationError({**exc.detail, **refused}) from None
            raise
        if refused:
            raise ValidationError(refused)
        return value


class StrictSerializer(StrictFieldsMixin, serializers.Serializer):
    pass


class StrictModelSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    pass


class EmptyBodySerializer(StrictSerializer):
    """For actions that take no input: any key in the body is unknown."""


def reject_body(request) -> None:
    """400 naming every key of a body sent to an action that takes none."""
    EmptyBodySerializer(data=request.data if isinstance(request.data, Mapping) else {}).is_valid(raise_exception=True)


# --- Query filters -------------------------------------------------------------------------------


class _UtcIsoDateTimeField(filter_fields.IsoDateTimeField):
    """django-filter's ISO 8601 field, refusing times that do not exist in UTC: 9999-12-31T23:59-23:00
    parses (the offset is legal) but is past year 9999 in UTC, which the database query would only
    find out with an OverflowError (a 500). Offsets outside ±24 h never parse at all. Times go to the
    database in UTC, since PostgreSQL refuses offsets beyond ±15:59 (another 500)."""

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            # In UTC: PostgreSQL refuses offsets beyond ±15:59 that Python (and ISO 8601) allow.
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            raise FormValidationError(self.error_messages["invalid"], code="invalid") from None


class IsoDateTimeFilter(filters.IsoDateTimeFilter):
    """Use instead of django-filter's: a bad or out-of-range time is a 400 naming the parameter."""

    field_class = _UtcIsoDateTimeField
