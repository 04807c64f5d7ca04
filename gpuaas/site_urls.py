"""Pages outside the admin and the API (the project view and /metrics join here)."""

from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from core.scopes import Scope, scoped
from notifications.views import account_urlpatterns as notification_account_urlpatterns
from notifications.views import project_urlpatterns as notification_project_urlpatterns
from tenancy.oidc.views import CallbackView, SignInView

from .dashboard.project_views import account_urlpatterns, home, project_urlpatterns
from .web.health import healthz, readyz

urlpatterns = [
    path("", home, name="home"),
    # Browsers ask for /favicon.ico on every page that names none (the admin's pages).
    path("favicon.ico", scoped(Scope.PUBLIC)(RedirectView.as_view(url=static("gpuaas/favicon.svg"), permanent=True))),
    path("projects/", include((project_urlpatterns + notification_project_urlpatterns, "projects"))),
    *account_urlpatterns,
    # Company sign-in (tenancy/oidc/): to the identity provider and back.
    path("oidc/authenticate/", scoped(Scope.PUBLIC)(SignInView.as_view()), name="oidc_authentication_init"),
    path("oidc/callback/", scoped(Scope.PUBLIC)(CallbackView.as_view()), name="oidc_authentication_callback"),
    *notification_account_urlpatterns,
    path("metrics", include("monitoring.urls")),
    # Kubernetes probes of the web Deployment (deploy/web.yaml).
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
]
