"""Who is knocking: the client's address behind the ingress, and the throttles and lockout keyed by it.

The address comes from django-ipware (python-ipware underneath), never from a header parsed here.
Behind `TRUSTED_PROXY_COUNT` proxies that each append to X-Forwarded-For, the client is the entry
that the farthest trusted proxy appended: the TRUSTED_PROXY_COUNT-th from the right. Entries to its
left were sent by the client and are ignored, so a forged header cannot buy a fresh address. With
no trusted proxy (the default) the socket's address (REMOTE_ADDR) is the client.

Three readers share `client_address()`: django-axes (AXES_CLIENT_IP_CALLABLE), the API's throttles
(AnonThrottle, UserThrottle) and anything else that logs or limits by address.
"""

from __future__ import annotations

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.http import HttpRequest
from ipware.ip import get_client_ip
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

FORWARDED_ORDER = ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR")


def client_address(request: HttpRequest) -> str | None:
    """The client's IP address as TRUSTED_PROXY_COUNT says to read it (module docstring).

    A request that came past fewer proxies than configured (a probe inside the cluster) has no
    trustworthy forwarded entry: its socket address is used, as it is the only hop we saw.
    """
    proxies = settings.TRUSTED_PROXY_COUNT
    if not proxies:
        address, _ = get_client_ip(request, request_header_order=("REMOTE_ADDR",))
        return address
    # ipware counts the proxies *listed* in X-Forwarded-For after the client; the nearest proxy is
    # REMOTE_ADDR and lists nobody, hence one fewer. Not strict: extra entries on the left (the
    # client's own, possibly forged) are ignored instead of voiding the chain.
    address, _ = get_client_ip(
        request,
        proxy_order="left-most",
        proxy_count=proxies - 1,
        request_header_order=FORWARDED_ORDER,
        strict=False,
    )
    return address or request.META.get("REMOTE_ADDR")


class ClientAddressMixin:
    """DRF throttles key anonymous callers by client_address(), not DRF's own NUM_PROXIES parsing."""

    def get_ident(self, request) -> str | None:
        return client_address(request)


class AnonThrottle(ClientAddressMixin, AnonRateThrottle):
    """The `anon` rate, per client address (behind the ingress too)."""


class UserThrottle(ClientAddressMixin, UserRateThrottle):
    """The `user` rate, per user; an unauthenticated request falls back to its client address."""


class LockoutHandler(AxesDatabaseHandler):
    """django-axes' database handler, except that a successful sign-in clears only its own username.

    Lockout counts per username (across addresses) and per address (across usernames):
    AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]. Axes' own reset on success deletes every
    attempt of either group, so anyone holding one valid account could sign in between guesses and
    reset their address's count, spraying other usernames without limit. Here a success forgives
    the failures made under that username (a mistyped password) and nothing else.
    """

    def reset_user_attempts(self, request: HttpRequest, credentials: dict | None = None) -> int:
        username = get_client_username(request, credentials)
        if username is None:
            return 0
        count, _ = AccessAttempt.objects.filter(username=username).delete()
        return count
