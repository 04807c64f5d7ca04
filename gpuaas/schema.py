"""The OpenAPI schema class (settings: DEFAULT_SCHEMA_CLASS). Its own module: gpuaas.api is imported
while DRF loads its settings, and drf-spectacular's AutoSchema imports DRF's settings back."""

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from capacity.api.strict import StrictFieldsMixin


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

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, StrictFieldsMixin):
            schema["additionalProperties"] = False
        return schema
