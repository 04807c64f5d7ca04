"""URL map: admin, the versioned REST API, its schema and docs (assets served locally)."""

from importlib import import_module

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path
from django.views.defaults import page_not_found
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from core.api import router
from core.permissions import DeclaredScope
from core.scopes import Scope

# Each app's api/urls.py registers its viewsets on the shared router and may add extra paths.
API_APPS = ("capacity", "pools", "scheduling", "operations", "billing", "monitoring")
_api_modules = [import_module(f"{app}.api.urls") for app in API_APPS]
api_extra = [p for module in _api_modules for p in getattr(module, "urlpatterns", [])]


class SchemaView(SpectacularAPIView):
    """The OpenAPI schema, public as before (drf-spectacular's own views set AllowAny)."""

    scope = Scope.PUBLIC
    permission_classes = [DeclaredScope]


class SwaggerView(SpectacularSwaggerView):
    scope = Scope.PUBLIC
    permission_classes = [DeclaredScope]


class RedocView(SpectacularRedocView):
    scope = Scope.PUBLIC
    permission_classes = [DeclaredScope]


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_extra + router.urls)),
    path("api/schema/", SchemaView.as_view(), name="schema"),
    path("api/docs/", SwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/redoc/", RedocView.as_view(url_name="schema"), name="redoc"),
    path("", include("gpuaas.site_urls")),
]


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """A path no route matches: under /api/ the JSON `detail` every API 404 documents (an id holding
    a `/` or a `.` misses the router's routes), elsewhere Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)


handler404 = not_found
