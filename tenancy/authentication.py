"""Bearer-token authentication against hashed ApiToken rows."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from .models import ApiToken


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer gpa_...` (or `Token gpa_...`). Expired and revoked keys are refused."""

    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower().decode() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: give one token after the keyword.")
        key = header[1].decode(errors="replace")
        token = ApiToken.objects.usable().select_related("user").filter(key_digest=ApiToken.digest(key)).first()
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request) -> str:
        return "Bearer"


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Documents ApiTokenAuthentication in the OpenAPI schema as HTTP bearer auth."""

    target_class = "tenancy.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal API token (gpa_...) from POST /api/v1/tokens/.",
        }
