"""Who may reach a route: every view declares one scope, and a view that declares none is refused.

The API's default permission class (core.permissions.DeclaredScope) reads a view's `scope`; plain Django
views (project pages, the dashboard, /metrics) declare theirs with the `scoped()` decorator, which
also enforces it. `manage.py check` (gpuaas/checks.py) lists every route without a valid scope, and
tests/foundation/test_route_matrix.py walks every URL pattern for every persona against one table of
expected answers per scope. How to declare a new view's scope: docs/security.md.
"""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ImproperlyConfigured, PermissionDenied

from tenancy.roles import operator_can, require_operator_perms


class Scope:
    """The five answers to "whose rows does this route show or change?" (core/permissions.py applies them)."""

    PROJECT = "project"  # the caller's projects' rows, through ProjectScopedQuerysetMixin
    OPERATOR = "operator"  # operators holding the action's model permissions (OperatorPermissions)
    OWN_USER = "own_user"  # only the caller's own rows (their API tokens), through OwnUserQuerysetMixin
    SIGNED_IN = "signed_in"  # any signed-in user: fleet-wide facts that are no one's secret (prices)
    PUBLIC = "public"  # anyone: sign-in page, API schema and docs, the front door's redirects

    ALL = (PROJECT, OPERATOR, OWN_USER, SIGNED_IN, PUBLIC)


def is_signed_in(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active)


def scoped(scope: str, *perms: str, credential=None, refused=None):
    """Declare and enforce a plain view's scope (the plain-view half of the choke point).

    PROJECT, OWN_USER and SIGNED_IN send anonymous callers to the sign-in page; the view then reads
    its rows through tenancy.roles.projects_for / `user=request.user`, so another project's page is a
    404. OPERATOR needs operator_can(user, *perms) (403 otherwise); `credential(request)` checks an
    alternative one (the /metrics scrape token): True or False decides, None means none was presented.
    `refused(request)`, when given, answers a refused caller instead of the 403. PUBLIC checks
    nothing. Sets `view.scope`, which wrappers built with functools.wraps (admin_view, never_cache,
    ...) carry outwards.
    """
    if scope not in Scope.ALL:
        raise ImproperlyConfigured(f"Unknown scope {scope!r}: use one of {', '.join(Scope.ALL)}")
    if scope == Scope.OPERATOR and not perms:
        raise ImproperlyConfigured("An operator view names the model permissions it needs.")

    def decorate(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            user = request.user
            if scope == Scope.OPERATOR:
                presented = None if credential is None else credential(request)
                allowed = operator_can(user, *perms) if presented is None else presented
                if not allowed:
                    if refused is not None:
                        return refused(request)
                    if presented is None:
                        require_operator_perms(user, *perms)  # raises, naming the permissions
                    raise PermissionDenied("The credential presented was refused.")
            elif scope != Scope.PUBLIC and not is_signed_in(user):
                return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
            return view(request, *args, **kwargs)

        wrapped.scope = scope
        return wrapped

    return decorate
