"""The /metrics page (included from gpuaas/site_urls.py)."""

from django.urls import path

from . import views

urlpatterns = [path("", views.metrics, name="metrics")]
