"""Writes to tenancy's tables that are not memberships (those are tenancy.roles.set_role): API tokens,
and the operator's unlock of a user locked out of signing in (django-axes' attempts).

Issuing a token is ApiToken.issue() (the model owns the key and expiry rules).
"""

from __future__ import annotations

from collections.abc import Iterable

from axes.utils import reset as axes_reset
from django.db import transaction
from django.utils import timezone

from .models import ApiToken


def revoke_token(token: ApiToken) -> int:
    """Revoke a token and every token minted with it (its descendants); returns how many were revoked.

    A token created by a request that authenticated with a token is that token's child
    (ApiToken.parent): whoever holds the parent could have made it, so it goes with it. Idempotent:
    one conditional UPDATE over the token and its descendants, counting only those not yet revoked
    (0: all were revoked already). Locks the token's row, then each level of descendants as it
    reads them (primary-key order): a token being minted concurrently with one of them
    (ApiToken.issue locks its parent) is either found and revoked, or refused.
    """
    with transaction.atomic():
        list(ApiToken.objects.select_for_update().filter(pk=token.pk).values_list("pk", flat=True))
        ids = [token.pk, *token.descendant_ids(lock=True)]
        return ApiToken.objects.filter(pk__in=ids, revoked_at__isnull=True).update(revoked_at=timezone.now())


def unlock_sign_in(usernames: Iterable[str]) -> int:
    """Clear the failed sign-ins of `usernames` from every address, ending their lockout now.

    The operator's early end to a cool-off (docs/security.md "Login lockout"); returns how many
    attempt rows were cleared. Failures counted against an address stay: they are the address's.
    """
    return sum(axes_reset(username=username) for username in sorted(set(usernames)))
