"""The sign-in pages' choices: a company sign-in button, a password form, or both."""

from django.conf import settings

from . import enabled, local_passwords


def sign_in(request) -> dict:
    return {
        "sign_in": {
            "oidc": enabled(),
            "provider_name": settings.OIDC_PROVIDER_NAME,
            "local_passwords": local_passwords(),
        }
    }
