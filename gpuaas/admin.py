"""The admin site: Django's, with the GPU dashboard mounted at /admin/dashboard/... ahead of its own URLs.

It is the default `admin.site` (gpuaas.apps.GpuaasAdminConfig), so every app registers on it as
usual and the dashboard pages live under the admin's login, permissions and look.
"""

from django.contrib import admin
from django.template.response import TemplateResponse
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from tenancy.oidc.views import password_sign_in_refused

from .dashboard.admin_views import urlpatterns as dashboard_urlpatterns


class GpuaasAdminSite(admin.AdminSite):
    def get_urls(self):
        return dashboard_urlpatterns(self) + super().get_urls()

    @method_decorator(never_cache)
    def login(self, request, extra_context=None):
        """A signed-in member (not staff) who opens an admin page is told the admin is for operators and
        sent back to their projects, instead of meeting a second login form. Anonymous visitors get the
        admin's login; a POST still signs in as someone else."""
        refused = password_sign_in_refused(request)  # LOCAL_PASSWORDS=0: company sign-in only
        if refused is not None:
            return refused
        if request.method == "GET" and request.user.is_authenticated and not self.has_permission(request):
            context = {**self.each_context(request), "title": "For operators only"}
            return TemplateResponse(request, "admin/operators_only.html", context, status=403)
        return super().login(request, extra_context)
