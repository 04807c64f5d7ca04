"""Bearer-token authentication against hashed ApiToken rows."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from . import oidc
from .models import ApiToken, ExternalIdentity


def stale_identity(user) -> bool:
    """A provider-linked user whose last check by the provider is older than OIDC_PERSONAL_TOKEN_RECHECK_H.

    Their gpa_ tokens stop working then: a person removed at the provider who never signs in again
    must not keep the roles they had through a long-lived personal token.
    """
    hours = settings.OIDC_PERSONAL_TOKEN_RECHECK_H
    try:
        identity = user.external_identity
    except ExternalIdentity.DoesNotExist:
        return False
    if not hours:
        return False
    return identity.last_seen_at is None or timezone.now() - identity.last_seen_at > dt.timedelta(hours=hours)


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
        if not key.startswith(ApiToken.PREFIX) and oidc.enabled():
            return None  # the identity provider's access token: OidcBearerAuthentication's
        token = (
            ApiToken.objects.usable()
            .select_related("user", "user__external_identity")
            .filter(key_digest=ApiToken.digest(key))
            .first()
        )
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        if stale_identity(token.user):
            raise exceptions.AuthenticationFailed(
                "This account signs in through the identity provider and has not been checked by it for "
                f"{settings.OIDC_PERSONAL_TOKEN_RECHECK_H} hours (OIDC_PERSONAL_TOKEN_RECHECK_H): sign in again."
            )
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
