"""Writes to tenancy's tables that are not memberships (those are tenancy.roles.set_role): API tokens.

Issuing a token is ApiToken.issue() (the model owns the key and expiry rules).
"""

from __future__ import annotations

from django.utils import timezone

from .models import ApiToken


def revoke_token(token: ApiToken) -> bool:
    """Revoke a token; False if it was revoked already (idempotent: a conditional UPDATE)."""
    return ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()) == 1
