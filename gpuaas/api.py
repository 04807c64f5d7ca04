"""Shared REST API pieces: pagination and the router every app registers on.

Who may call what is decided in one place, gpuaas/permissions.py (DeclaredScope, the default
permission class, and the queryset mixins every scoped view uses).
"""

from rest_framework.pagination import PageNumberPagination
from rest_framework.routers import APIRootView, DefaultRouter

from .scopes import Scope


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 1000


class ApiRootView(APIRootView):
    """The browsable index of the API: a list of links, for any signed-in user (as before)."""

    scope = Scope.SIGNED_IN


class Router(DefaultRouter):
    APIRootView = ApiRootView


router = Router()
