"""URL map: admin, the versioned REST API, its schema and docs (assets served locally)."""

from importlib import import_module

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from .api import router

# Each app's api/urls.py registers its viewsets on the shared router and may add extra paths.
API_APPS = ("capacity", "pools", "operations", "billing", "monitoring")
_api_modules = [import_module(f"{app}.api.urls") for app in API_APPS]
api_extra = [p for module in _api_modules for p in getattr(module, "urlpatterns", [])]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_extra + router.urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("", include("gpuaas.site_urls")),
]
