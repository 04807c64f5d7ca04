"""Company sign-in: OpenID Connect through mozilla-django-oidc (docs/security.md "Company sign-in").

- provider.py: the one adapter that talks to the identity provider (discovery, JWKS, token checks).
- backend.py: the Django authentication backends (OIDC sign-in; local passwords, switchable off).
- authentication.py: the REST API's bearer tokens from the provider, beside gpuaas's own `gpa_` tokens.
- middleware.py: renews an OIDC session's sign-in when its ID token's renewal time has passed.
- views.py, urls.py: /oidc/authenticate/, /oidc/callback/, and the refusals' pages.

Everything is read from settings at request time, so OIDC_ISSUER empty (the default) turns it all off.
"""

from __future__ import annotations

from django.conf import settings


def enabled() -> bool:
    return bool(getattr(settings, "OIDC_ISSUER", ""))


def local_passwords() -> bool:
    return bool(getattr(settings, "LOCAL_PASSWORDS", True))
