"""The API's permission choke point: every view declares its scope, and a view that declares none is refused.

DeclaredScope is the default permission class (settings.REST_FRAMEWORK): it reads the view's `scope`
(core.scopes.Scope) and applies that scope's rule. Project-scoped querysets pass through
ProjectScopedQuerysetMixin, the caller's own rows through OwnUserQuerysetMixin, operator routes
through OperatorPermissions (the one IsOperator). A custom action may narrow its viewset's scope
with `@action(..., scope=Scope.OPERATOR)`. How to declare a new view: docs/security.md.
Imported by DRF's settings, so this module must not import rest_framework.views or routers.
"""

from django.core.exceptions import ImproperlyConfigured
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.permissions import SAFE_METHODS, BasePermission

from tenancy.roles import in_projects_of, operator_can

from .scopes import Scope, is_signed_in


class ProjectScopedQuerysetMixin:
    """Every queryset scoped to the caller's projects; operators see everything.

    The filter is tenancy.roles.in_projects_of (on PostgreSQL `project_id = ANY(ARRAY(subquery))`), so
    the planner starts each list from the member's own projects' rows (an index scan on the project
    column) instead of joining the whole table before filtering: a member's page costs the same however
    much history other projects have (tests/foundation/test_member_list_plans.py).

    Set `project_lookup` to the path from the model to its Project ("project", "pool__project",
    "self" for Project itself), or to None where rows reach projects through allocations held for a
    while rather than a foreign key: the model's QuerySet.visible_to(user) then decides (metric
    series, health events). Another project's object is therefore simply not found: a 404, never a 403.
    """

    scope = Scope.PROJECT
    project_lookup: str | None = "project"

    def get_queryset(self):
        queryset = super().get_queryset()
        user = self.request.user
        if self.project_lookup is None:
            return queryset.visible_to(user)
        column = "pk" if self.project_lookup == "self" else f"{self.project_lookup}_id"
        condition = in_projects_of(user, column)
        return queryset if condition is None else queryset.filter(condition)  # None: operators


class OwnUserQuerysetMixin:
    """Only the caller's own rows (`user_lookup` is the path to their user), for operators too."""

    scope = Scope.OWN_USER
    user_lookup = "user"

    def get_queryset(self):
        return super().get_queryset().filter(**{self.user_lookup: self.request.user})


class OperatorPermissions(BasePermission):
    """Operator-only endpoints: an active staff user holding the Django model permissions of the action.

    By default, like DjangoModelPermissions but also for reads: GET/HEAD/OPTIONS need `view_<model>`,
    POST `add_`, PUT/PATCH `change_`, DELETE `delete_` of the view's queryset model. A view sets
    `operator_perms = {"<action or method>": ("app.codename", ...)}` for custom actions and for
    APIViews without a model. Staff without the permission get 403; anonymous callers 401.
    The Operators group (tenancy.roles.operators_group) holds every operator permission.
    """

    message = "Operators only: your account lacks the permission this action needs (the Operators group has it)."
    METHOD_ACTIONS = {
        "GET": "view",
        "HEAD": "view",
        "OPTIONS": "view",
        "POST": "add",
        "PUT": "change",
        "PATCH": "change",
        "DELETE": "delete",
    }

    def required(self, request, view) -> tuple[str, ...]:
        overrides = getattr(view, "operator_perms", {})
        action = getattr(view, "action", None)
        for key in (action, request.method.lower(), "*"):
            if key in overrides:
                return tuple(overrides[key])
        verb = self.METHOD_ACTIONS.get(request.method)
        if verb is None:  # a method no view serves (UnsupportedMethodMiddleware answers most first)
            raise MethodNotAllowed(request.method)
        model = view.get_queryset().model
        if (
            action not in (None, "list", "retrieve", "create", "update", "partial_update", "destroy")
            and request.method not in SAFE_METHODS
        ):
            # A custom write action nobody mapped: refuse rather than guess.
            raise ImproperlyConfigured(f"{type(view).__name__}.{action}: say its operator_perms")
        return (f"{model._meta.app_label}.{verb}_{model._meta.model_name}",)

    def has_permission(self, request, view) -> bool:
        return operator_can(request.user, *self.required(request, view))


# A declared scope is honoured only when the view's queryset really passes through its mixin.
SCOPE_MIXINS = {Scope.PROJECT: ProjectScopedQuerysetMixin, Scope.OWN_USER: OwnUserQuerysetMixin}


class DeclaredScope(BasePermission):
    """The default permission class: refuse a view that declares no scope, else apply its scope's rule.

    PUBLIC: anyone. SIGNED_IN: any active signed-in user. PROJECT and OWN_USER: signed in, and the
    rows come from the scope's mixin (a view declaring the scope without the mixin is refused).
    OPERATOR: OperatorPermissions; on a detail action of a project-scoped viewset the object is
    looked up first, so a non-operator still gets 404 for another project's object and 403 for their own.
    """

    def has_permission(self, request, view) -> bool:
        scope = getattr(view, "scope", None)
        if scope == Scope.PUBLIC:
            return True
        if scope == Scope.OPERATOR:
            operator = OperatorPermissions()
            if operator.has_permission(request, view):
                return True
            self.message = operator.message
            if (
                is_signed_in(request.user)
                and getattr(view, "detail", False)
                and isinstance(view, SCOPE_MIXINS[Scope.PROJECT])
            ):
                view.get_object()  # raises the 404 of an object the caller cannot see
            return False
        if scope in (Scope.SIGNED_IN, *SCOPE_MIXINS):
            if scope in SCOPE_MIXINS and not isinstance(view, SCOPE_MIXINS[scope]):
                self.message = f"{type(view).__name__} declares scope {scope!r} without {SCOPE_MIXINS[scope].__name__}."
                return False
            return is_signed_in(request.user)
        self.message = f"{type(view).__name__} declares no scope (core.scopes.Scope): refused."
        return False
