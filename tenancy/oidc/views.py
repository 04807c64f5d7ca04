"""/oidc/authenticate/ and /oidc/callback/: mozilla-django-oidc's views, read lazily, failing in words.

A provider that cannot be reached or is misconfigured is a 503 page naming what to check, never a
500; a refused sign-in (no mapped group, expired provider session) signs out and says why on the
sign-in page.
"""

from __future__ import annotations

import logging

import requests
from django.conf import settings
from django.contrib import auth, messages
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.views.generic import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from . import enabled, local_passwords, provider

logger = logging.getLogger(__name__)


def unavailable(request, exc: Exception):
    logger.warning("OIDC provider unavailable: %s", exc)
    context = {"provider_name": settings.OIDC_PROVIDER_NAME, "reason": str(exc)}
    return TemplateResponse(request, "oidc/unavailable.html", context, status=503)


def _not_configured(request):
    messages.error(request, "Company sign-in is not configured on this gpuaas (OIDC_ISSUER is empty).")
    return redirect(settings.LOGIN_URL)


class _ProviderGuard:
    """get() only while company sign-in is configured; the unavailable page when the provider does not answer."""

    def get(self, request):
        if not enabled():
            return _not_configured(request)
        try:
            return super().get(request)
        except provider.ProviderUnavailable as exc:
            return unavailable(request, exc)


class SignInView(_ProviderGuard, OIDCAuthenticationRequestView):
    """Sends the browser to the provider's authorization endpoint (state, nonce and PKCE in the session)."""

    def __init__(self, **kwargs):
        View.__init__(self, **kwargs)

    OIDC_OP_AUTH_ENDPOINT = property(lambda self: provider.endpoint("authorization_endpoint"))
    OIDC_RP_CLIENT_ID = property(lambda self: settings.OIDC_RP_CLIENT_ID)


class CallbackView(_ProviderGuard, OIDCAuthenticationCallbackView):
    """The provider sends the browser back here with a code; OidcBackend exchanges and checks it."""

    def get(self, request):
        try:
            return super().get(request)
        except requests.RequestException as exc:  # the token endpoint refused or could not be reached
            return unavailable(request, provider.ProviderUnavailable(f"the token endpoint failed: {exc}"))

    def login_failure(self):
        request = self.request
        reason = getattr(request, "oidc_refusal", None)
        if request.GET.get("error") == "login_required":
            reason = f"Your sign-in with {settings.OIDC_PROVIDER_NAME} has ended: sign in again."
        if request.user.is_authenticated:
            auth.logout(request)
        messages.error(request, reason or f"Sign-in with {settings.OIDC_PROVIDER_NAME} did not complete; try again.")
        return redirect(settings.LOGIN_URL)


def password_sign_in_refused(request):
    """The answer to a password posted to a sign-in page while LOCAL_PASSWORDS=0, or None to go on."""
    if request.method != "POST" or local_passwords():
        return None
    context = {"provider_name": settings.OIDC_PROVIDER_NAME, "oidc": enabled()}
    return TemplateResponse(request, "oidc/passwords_off.html", context, status=403)
