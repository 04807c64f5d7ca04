"""The REST API's bearer tokens from the identity provider, beside gpuaas's own `gpa_` tokens.

A token that is not a `gpa_` key is taken for the provider's access token: it must be a JWT the
provider signed (JWKS) for gpuaas (`aud` or `azp` = OIDC_API_AUDIENCE), unexpired, and the
provider's userinfo endpoint must still accept it; the person's roles are then re-applied from the
groups userinfo gives now. That answer is kept OIDC_BEARER_CACHE_SECONDS (never past the token's
expiry), so a person removed from a group loses access within that many seconds (0: every request).
"""

from __future__ import annotations

import hashlib
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.exceptions import SuspiciousOperation
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from mozilla_django_oidc.contrib.drf import OIDCAuthentication
from rest_framework import exceptions, status

from ..models import ApiToken
from . import enabled, provider
from .backend import OidcBackend


class ProviderUnavailableError(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "identity_provider_unavailable"


class OidcBearerAuthentication(OIDCAuthentication):
    www_authenticate_realm = "gpuaas"

    def __init__(self, backend=None):
        self.backend = backend  # built per request: it carries that request's refusal

    def authenticate(self, request):
        if not enabled():
            return None
        token = self.get_access_token(request)
        if not token or token.startswith(ApiToken.PREFIX):
            return None
        key = "oidc-bearer:" + hashlib.sha256(token.encode()).hexdigest()
        user_id = cache.get(key)
        if user_id is not None:
            user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
            if user is not None:
                return user, None
        backend = self.backend or OidcBackend()
        try:
            claims = provider.verify(token, audience=settings.OIDC_API_AUDIENCE, allow_azp=True)
            user = backend.get_or_create_user(token, None, claims)
        except provider.ProviderUnavailable as exc:
            raise ProviderUnavailableError(f"Sign-in cannot be checked: {exc}.") from exc
        except SuspiciousOperation as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from exc
        if user is None:
            raise exceptions.AuthenticationFailed(backend.refusal or "The identity provider's token names no user.")
        if not user.is_active:
            raise exceptions.AuthenticationFailed("This account is deactivated in gpuaas.")
        ttl = min(settings.OIDC_BEARER_CACHE_SECONDS, int(claims["exp"] - time.time()))
        if ttl > 0:
            cache.set(key, user.pk, ttl)
        return user, None


class OidcBearerScheme(OpenApiAuthenticationExtension):
    """Documents OidcBearerAuthentication in the OpenAPI schema as HTTP bearer auth (a JWT)."""

    target_class = "tenancy.oidc.authentication.OidcBearerAuthentication"
    name = "oidcBearer"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": "An access token from the identity provider (OIDC_ISSUER), when company sign-in is on.",
        }
