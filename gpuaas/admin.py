"""Mount the GPU dashboard in the admin: /admin/dashboard/... ahead of the admin's own URLs.

The default admin site is kept (every app registers on it); its get_urls() is wrapped so the
dashboard pages live under the admin's login, permissions and look.
"""

from django.contrib import admin

from .dashboard.admin_views import urlpatterns as dashboard_urlpatterns

_admin_get_urls = admin.site.get_urls


def _get_urls():
    return dashboard_urlpatterns(admin.site) + _admin_get_urls()


admin.site.get_urls = _get_urls
