"""Shared REST API pieces: pagination and the router every app registers on."""

from rest_framework.pagination import PageNumberPagination
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
        from pools.roles import project_ids_for

        queryset = super().get_queryset()
        ids = project_ids_for(self.request.user)
        if ids is None:  # operators
            return queryset
        lookup = "pk" if self.project_lookup == "self" else f"{self.project_lookup}_id"
        return queryset.filter(**{f"{lookup}__in": ids})
