"""The OpenAPI schema class (settings: DEFAULT_SCHEMA_CLASS). Its own module: core.api is imported
while DRF loads its settings, and drf-spectacular's AutoSchema imports DRF's settings back."""

import re

from django.db import connections, router
from django_filters import filters
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import get_view_model
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from capacity.api.strict import StrictFieldsMixin
from core.api import BIGINT_RANGE, FilterBackend, column_range


class ErrorSerializer(serializers.Serializer):
    """What DRF answers for 401, 403, 404 and 429."""

    detail = serializers.CharField()


VALIDATION_ERROR = {
    "description": "Invalid input: each field named with what to fix.",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "additionalProperties": {},
                "description": 'Field name -> messages, e.g. {"count": ["Ensure this value is ..."]}.',
            }
        }
    },
}
ERRORS = {
    "401": "Not signed in (no or bad credentials).",
    "403": "Signed in, but not allowed.",
    "404": "Not found (or not yours), or a page past the end.",
    "429": "Too many requests.",
}


class ApiAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, plus what every endpoint may really answer: 400 with field
    messages, 401, 403, 404 and 429 with a `detail`; and request bodies of strict serializers
    (capacity.api.strict) declare that they take no other properties."""

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        responses.setdefault("400", VALIDATION_ERROR)
        for code, description in ERRORS.items():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=description), code, direction=direction
                )
        return responses

    def _get_filter_parameters(self):
        """Integer filters say the range FilterBackend enforces (the column's on this database): a
        value outside it is a 400, so the schema must not offer it."""
        parameters = super()._get_filter_parameters()
        bounds: dict[str, tuple[int, int]] = {}
        filtered = any(issubclass(backend, FilterBackend) for backend in self.get_filter_backends())
        model = get_view_model(self.view) if filtered else None
        if model is not None:
            filterset_class = FilterBackend().get_filterset_class(self.view, model._default_manager.none())
            if filterset_class is not None:
                connection = connections[router.db_for_read(model)]
                for name, filter_ in filterset_class.base_filters.items():
                    if isinstance(filter_, filters.NumberFilter):
                        found = column_range(filterset_class._meta.model or model, filter_.field_name, connection)
                        if found is not None:
                            bounds[name] = found
        for parameter in parameters:
            schema = parameter.get("schema", {})
            if parameter.get("in") != "query":
                continue
            if parameter["name"] in bounds and schema.get("type") == "number":
                schema["type"] = "integer"  # a number filter on an integer column takes whole numbers
                schema.pop("format", None)
            if schema.get("type") == "integer":
                low, high = bounds.get(parameter["name"], BIGINT_RANGE)
                schema.setdefault("minimum", low)
                schema.setdefault("maximum", high)
        return parameters

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        """A field whose bound is operator policy (pools.api.serializers.UnitCountField) states it as it is now."""
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if hasattr(field, "schema_maximum"):
            schema["maximum"] = field.schema_maximum()
        return schema

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, StrictFieldsMixin):
            schema["additionalProperties"] = False
        return schema


# drf-spectacular's pattern for a DecimalField ("^-?\\d{0,8}(?:\\.\\d{0,2})?$") also matches "", "-" and
# ".", which DRF refuses ("A valid number is required."): the schema offered inputs that get a 400.
_DECIMAL_PATTERN = re.compile(r"^\^-\?\\d\{0,(\d+)\}\(\?:\\\.\\d\{0,(\d+)\}\)\?\$$")


def _walk(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def require_decimal_digits(result, generator, request, public):
    """Postprocessing hook (SPECTACULAR_SETTINGS): every decimal string pattern needs a digit."""
    for node in _walk(result):
        pattern = node.get("pattern")
        if node.get("format") == "decimal" and isinstance(pattern, str):
            found = _DECIMAL_PATTERN.match(pattern)
            if found:
                whole, fraction = found.groups()
                node["pattern"] = rf"^-?(?:\d{{1,{whole}}}(?:\.\d{{0,{fraction}}})?|\.\d{{1,{fraction}}})$"
    return result


# Django's and DRF's text fields refuse NUL ("Null characters are not allowed."; PostgreSQL cannot store
# it): a text schema says so unless an enum, a format or a pattern already narrows it.
NO_NUL_PATTERN = "^[^\\u0000]*$"
# A text that may not be blank: DRF trims whitespace (Python's, which also counts \x1c-\x1f and \x85)
# before it checks, so "\f" is blank although its length is 1.
NOT_BLANK_PATTERN = "^[^\\u0000]*[^\\s\\u0000\\u001c-\\u001f\\u0085][^\\u0000]*$"


def refuse_nul_in_text(result, generator, request, public):
    """Postprocessing hook (SPECTACULAR_SETTINGS): every free text a client sends (a parameter, a request
    body, a request component: COMPONENT_SPLIT_REQUEST names them ...Request) takes no NUL character,
    and one that may not be blank needs a character that is not whitespace."""
    sent = [
        part
        for methods in result.get("paths", {}).values()
        for operation in methods.values()
        if isinstance(operation, dict)
        for part in (operation.get("parameters"), operation.get("requestBody"))
        if part
    ]
    schemas = result.get("components", {}).get("schemas", {})
    sent += [schema for name, schema in schemas.items() if name.endswith("Request")]
    for node in _walk(sent):
        if node.get("type") == "string" and not {"enum", "format", "pattern"} & set(node):
            node["pattern"] = NOT_BLANK_PATTERN if node.get("minLength", 0) >= 1 else NO_NUL_PATTERN
    return result
