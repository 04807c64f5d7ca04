"""Renewing an OIDC session: mozilla-django-oidc's SessionRefresh, read lazily and closed to writes.

A session signed in through the provider is good until OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS after its
sign-in. The first request after that renews it: a page load (GET) goes to the provider with
`prompt=none`, which answers at once while the person's provider session lasts; the callback then
re-applies their groups (a removed group's roles go) or, if the provider refuses, signs them out.
Any other request (a form post, an API write) after that time signs the session out and is refused,
where mozilla-django-oidc would let it through: a person removed from a group cannot post their way
past the renewal.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.utils.deprecation import MiddlewareMixin
from django.utils.functional import cached_property
from mozilla_django_oidc.middleware import SessionRefresh as MozillaSessionRefresh

from . import enabled, provider
from .views import unavailable

OIDC_BACKEND = "tenancy.oidc.backend.OidcBackend"


def _wants_json(request) -> bool:
    fetch_mode = request.headers.get("Sec-Fetch-Mode")
    return (
        request.path.startswith("/api/")
        or request.headers.get("x-requested-with") == "XMLHttpRequest"
        or (fetch_mode is not None and fetch_mode != "navigate")
    )


class SessionRefresh(MozillaSessionRefresh):
    def __init__(self, get_response):
        MiddlewareMixin.__init__(self, get_response)  # settings are read per request below

    OIDC_EXEMPT_URLS = property(lambda self: settings.OIDC_EXEMPT_URLS)
    OIDC_OP_AUTHORIZATION_ENDPOINT = property(lambda self: provider.endpoint("authorization_endpoint"))
    OIDC_RP_CLIENT_ID = property(lambda self: settings.OIDC_RP_CLIENT_ID)
    OIDC_STATE_SIZE = 32
    OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
    OIDC_RP_SCOPES = property(lambda self: settings.OIDC_RP_SCOPES)
    OIDC_USE_NONCE = property(lambda self: settings.OIDC_USE_NONCE)
    OIDC_NONCE_SIZE = 32

    @cached_property
    def exempt_urls(self) -> set[str]:
        names = ("oidc_authentication_init", "oidc_authentication_callback")
        return {*settings.OIDC_EXEMPT_URLS, *(reverse(name) for name in names)}

    exempt_url_patterns = frozenset()

    def process_request(self, request):
        if not (enabled() and request.user.is_authenticated):
            return None
        if request.session.get(BACKEND_SESSION_KEY) != OIDC_BACKEND:
            return None
        if request.session.get("oidc_id_token_expiration", 0) > time.time():
            return None
        if request.path in self.exempt_urls:
            return None
        if request.method != "GET":
            auth.logout(request)
            message = "Your sign-in has expired: sign in again (nothing was changed)."
            if _wants_json(request):
                return JsonResponse({"detail": message}, status=401)
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        try:
            response = super().process_request(request)
        except provider.ProviderUnavailable as exc:
            return unavailable(request, exc)
        if isinstance(response, HttpResponseRedirect) and _wants_json(request):
            url = response["Location"]
            response = JsonResponse(
                {"detail": "Your sign-in needs renewing: reload the page.", "refresh_url": url}, status=403
            )
            response["refresh_url"] = url
        return response
