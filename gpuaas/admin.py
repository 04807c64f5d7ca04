"""The admin site: Django's, with the GPU dashboard mounted at /admin/dashboard/... ahead of its own URLs.

It is the default `admin.site` (gpuaas.apps.GpuaasAdminConfig), so every app registers on it as
usual and the dashboard pages live under the admin's login, permissions and look.
"""

from django.contrib import admin

from .dashboard.admin_views import urlpatterns as dashboard_urlpatterns


class GpuaasAdminSite(admin.AdminSite):
    def get_urls(self):
        return dashboard_urlpatterns(self) + super().get_urls()
