from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class GpuaasConfig(AppConfig):
    """The project package: settings, URLs, the API router, the dashboard (no models)."""

    name = "gpuaas"

    def ready(self) -> None:
        from . import checks  # noqa: F401  cycle: registers the declared-scope check; it imports the API (models)


class GpuaasAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin with gpuaas's site (the dashboard mounted in it) as the default `admin.site`.

    Imported by module, not by class, so Django does not take AdminConfig for the gpuaas app's config.
    """

    default = False
    default_site = "gpuaas.admin.GpuaasAdminSite"
