"""Shared REST API pieces: pagination, the router every app registers on, scoping and operator permissions."""

from django.core.exceptions import ImproperlyConfigured
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.routers import DefaultRouter


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 1000


router = DefaultRouter()


class ProjectScopedQuerysetMixin:
    """Every queryset scoped to the caller's projects in one subquery; operators see everything.

    Set `project_lookup` to the path from the model to its Project ("project", "pool__project", ...).
    Another project's object is therefore simply not found: a 404, never a 403.
    """

    project_lookup = "project"

    def get_queryset(self):
        from tenancy.roles import project_ids_for

        queryset = super().get_queryset()
        ids = project_ids_for(self.request.user)
        if ids is None:  # operators
            return queryset
        lookup = "pk" if self.project_lookup == "self" else f"{self.project_lookup}_id"
        return queryset.filter(**{f"{lookup}__in": ids})


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
        model = view.get_queryset().model
        verb = self.METHOD_ACTIONS.get(request.method)
        if verb is None or (
            action not in (None, "list", "retrieve", "create", "update", "partial_update", "destroy")
            and request.method not in SAFE_METHODS
        ):
            # A custom write action nobody mapped: refuse rather than guess.
            raise ImproperlyConfigured(f"{type(view).__name__}.{action}: say its operator_perms")
        return (f"{model._meta.app_label}.{verb}_{model._meta.model_name}",)

    def has_permission(self, request, view) -> bool:
        from tenancy.roles import operator_can

        return operator_can(request.user, *self.required(request, view))
