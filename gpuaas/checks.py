"""`manage.py check` refuses routes that declare no scope (core.scopes), so none reaches production.

`routes()` walks every URL pattern once; tests/foundation/test_route_matrix.py walks the same list.
Django admin pages are the admin's business (admin_view plus each ModelAdmin's has_*_permission)
and are summarised by one rule there; everything else must declare a scope.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.core import checks
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.views import APIView

from .permissions import SCOPE_MIXINS, DeclaredScope
from .scopes import Scope

ADMIN_NAMESPACE = "admin"


@dataclass
class Route:
    """One URL pattern: its path, name, and the scope of each HTTP method (DRF) or of the view (plain)."""

    path: str
    name: str | None
    namespace: str | None
    callback: object
    scopes: dict[str, str | None] = field(default_factory=dict)  # method ("*" for a plain view) -> scope
    problems: list[str] = field(default_factory=list)

    @property
    def is_admin(self) -> bool:
        return self.namespace == ADMIN_NAMESPACE


def _walk(resolver, prefix: str = "", namespace: str | None = None):
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern, prefix + str(pattern.pattern), pattern.namespace or namespace)
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.name, namespace, pattern.callback


def _drf_scopes(route: Route) -> None:
    view_class = route.callback.cls
    initkwargs = getattr(route.callback, "initkwargs", {})
    if "permission_classes" in initkwargs or list(view_class.permission_classes) != [DeclaredScope]:
        route.problems.append("sets its own permission_classes: declare a scope instead")
    actions = getattr(route.callback, "actions", None)
    methods = (
        {m: a for m, a in actions.items()}
        if actions
        else {m: None for m in view_class.http_method_names if m != "options" and hasattr(view_class, m)}
    )
    for method in methods:
        scope = initkwargs.get("scope", getattr(view_class, "scope", None))
        route.scopes[method] = scope
        if scope in SCOPE_MIXINS and not issubclass(view_class, SCOPE_MIXINS[scope]):
            route.problems.append(f"declares scope {scope!r} but does not use {SCOPE_MIXINS[scope].__name__}")


def routes(urlconf=None) -> list[Route]:
    """Every URL pattern (of ROOT_URLCONF, or `urlconf`) with the scopes it declares and what is wrong with them."""
    found = []
    for path, name, namespace, callback in _walk(get_resolver(urlconf)):
        route = Route(path, name, namespace, callback)
        view_class = getattr(callback, "cls", None)
        if isinstance(view_class, type) and issubclass(view_class, APIView):
            _drf_scopes(route)
        else:
            route.scopes["*"] = getattr(callback, "scope", None)
        if not route.is_admin:
            for method, scope in route.scopes.items():
                if scope not in Scope.ALL:
                    route.problems.append(f"{method.upper()} declares no scope ({scope!r})")
        found.append(route)
    return found


@checks.register(checks.Tags.security, checks.Tags.urls)
def check_declared_scopes(app_configs=None, **kwargs) -> list[checks.Error]:
    """gpuaas.E001: a route outside the admin that declares no valid scope (it would be refused anyway)."""
    return [
        checks.Error(
            f"{route.path} ({route.name or route.callback.__qualname__}): {'; '.join(route.problems)}",
            hint="Declare its scope: docs/security.md, 'Declaring a view's scope'.",
            obj=route.callback,
            id="gpuaas.E001",
        )
        for route in routes()
        if route.problems
    ]
