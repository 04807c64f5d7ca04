"""Writes to tenancy's tables that are not memberships (those are tenancy.roles.set_role): API tokens,
and the operator's unlock of a user locked out of signing in (django-axes' attempts).

Issuing a token is ApiToken.issue() (the model owns the key and expiry rules).
"""

from __future__ import annotations

from collections.abc import Iterable

from axes.utils import reset as axes_reset
from django.utils import timezone

from .models import ApiToken


def revoke_token(token: ApiToken) -> bool:
    """Revoke a token; False if it was revoked already (idempotent: a conditional UPDATE)."""
    return ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()) == 1


def unlock_sign_in(usernames: Iterable[str]) -> int:
    """Clear the failed sign-ins of `usernames` from every address, ending their lockout now.

    The operator's early end to a cool-off (docs/security.md "Login lockout"); returns how many
    attempt rows were cleared. Failures counted against an address stay: they are the address's.
    """
    return sum(axes_reset(username=username) for username in sorted(set(usernames)))
