"""The project view for project members, outside the admin: /projects/ (login required, session auth).

Every view declares its scope with core.scopes.scoped() (sign-in enforced there); project pages
read through tenancy.roles.projects_for(user): another project's page or pool is a 404, never a 403.
"""

from __future__ import annotations

from functools import wraps

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse, reverse_lazy
from django.utils.dateparse import parse_datetime
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods

from core.scopes import Scope, scoped
from pools.models import Allocation, GpuPool
from tenancy import roles
from tenancy.models import ApiToken
from tenancy.oidc.views import password_sign_in_refused
from tenancy.roles import projects_for
from tenancy.services import revoke_token

from . import projects, sources, timeseries
from .admin_views import DASHBOARD_PERMISSIONS
from .forms import ApiTokenForm, PoolRequestForm

LOGIN_URL = reverse_lazy("login")
member_required = scoped(Scope.PROJECT)  # signed in; the rows come from projects_for(user)
own_user_required = scoped(Scope.OWN_USER)  # signed in; only request.user's rows


@scoped(Scope.PUBLIC)
def home(request):
    """The front door: sign in (anonymous), the GPU dashboard (operators), the project view (members)."""
    if not request.user.is_authenticated:
        return redirect(LOGIN_URL)
    if roles.operator_can(request.user, *DASHBOARD_PERMISSIONS):
        return redirect("admin:gpuaas_dashboard")
    mine = list(projects_for(request.user).order_by("slug").values_list("slug", flat=True)[:2])
    if len(mine) == 1:
        return redirect("projects:project", mine[0])
    return redirect("projects:list")


def can_request(user, project) -> bool:
    """Members and project admins may ask for capacity (the API's rule); viewers may not."""
    if roles.operator_can(user, "pools.add_poolrequest"):
        return True
    return roles.has_project_perm(user, project, "request_capacity")


def _scoped_project(user, slug: str):
    project = projects.project_of_user(user, slug)
    if project is None:
        raise Http404("No such project")
    return project


def table_rows(panel: dict) -> dict:
    """A server panel with its items laid out as rows of cells, for a template to print.

    A "datetime" column's ISO text becomes a datetime, so the template prints it as the rest of the page does.
    """
    if not panel.get("available"):
        return panel
    columns = panel["columns"]
    rows = [[_cell(item.get(c["key"]), c) for c in columns] for item in panel["items"]]
    return panel | {"rows": rows}


def _cell(value, column: dict) -> dict:
    when = column.get("type") == "datetime"
    if when and isinstance(value, str):
        value = parse_datetime(value)
    return {"value": value, "num": column.get("num", False), "datetime": when}


def _overview(request, scope, project=None):
    project_ids = list(scope.values_list("pk", flat=True))
    return render(
        request,
        "projects/index.html",
        {
            "project": project,
            "projects": projects.visible_projects(request.user) if project is None else [project],
            "pools": projects.pool_cards(projects.held_pools(scope)),
            "requests": projects.recent_requests(scope),
            "best_effort": projects.best_effort_requests(scope),
            "profiles": projects.profile_distribution(Allocation.objects.filter(project__in=scope)),
            "costs": table_rows(sources.month_costs(project_ids)),
            "trespass": table_rows(sources.trespass_events(project_ids)),
            "can_request": project is not None and can_request(request.user, project),
        },
    )


@require_GET
@member_required
def project_list(request):
    """All the user's projects: their pools as cards, their requests and this month's costs."""
    return _overview(request, projects.visible_projects(request.user))


@require_GET
@member_required
def project_detail(request, slug: str):
    project = _scoped_project(request.user, slug)
    return _overview(request, projects_for(request.user).filter(pk=project.pk), project)


def _scoped_pool(user, slug: str, pk: int) -> GpuPool:
    project = _scoped_project(user, slug)
    return get_object_or_404(GpuPool.objects.select_related("project", "cluster", "request"), pk=pk, project=project)


@require_GET
@member_required
def pool_detail(request, slug: str, pk: int):
    """A pool's card with two tabs: Allocation (its units by node) and Monitoring (SM activity and power, and
    which of the project's pods used which unit over the last 3 hours)."""
    pool = _scoped_pool(request.user, slug, pk)
    (card,) = projects.pool_cards(GpuPool.objects.filter(pk=pool.pk))
    return render(
        request,
        "projects/pool.html",
        {
            "project": pool.project,
            "pool": pool,
            "card": card,
            "allocation": projects.pool_allocations(pool),
            "series": timeseries.pool_series(pool),
            "pods": timeseries.pool_pods(pool),
        },
    )


@require_GET
@never_cache
@member_required
def pool_series(request, slug: str, pk: int):
    """The monitoring tab's chart data, re-fetched every 15 s."""
    return JsonResponse(timeseries.pool_series(_scoped_pool(request.user, slug, pk)))


@never_cache
@member_required
@require_http_methods(["GET", "POST"])
def request_new(request, slug: str):
    """The pool request form. "Check availability" shows what the fleet offers for the spec (or the
    shortage, as approval would explain it) without creating anything; "Submit request" creates it."""
    project = _scoped_project(request.user, slug)
    if not can_request(request.user, project):
        raise PermissionDenied("Your role in this project cannot request capacity.")
    form = PoolRequestForm(request.POST or None, project=project, request=request)
    offers = None
    if request.method == "POST" and form.is_valid():
        if "check" in request.POST:
            offers = projects.availability_check(form.draft())
        else:
            created = form.save()
            messages.success(request, f"Request #{created.pk} ({created.spec_label} x {created.count}) submitted.")
            return redirect("projects:project", project.slug)
    return render(request, "projects/request_form.html", {"project": project, "form": form, "offers": offers})


@never_cache
@own_user_required
@require_http_methods(["GET", "POST"])
def tokens(request):
    """The user's own API tokens: create one (its key is shown on this response only) and list them."""
    form = ApiTokenForm(request.POST or None, request=request)
    created = None
    if request.method == "POST" and form.is_valid():
        created = form.save()
        form = ApiTokenForm(request=request)
    listed = ApiToken.objects.filter(user=request.user).order_by("-created_at", "-id")
    return render(request, "projects/tokens.html", {"form": form, "created": created, "tokens": listed})


@never_cache
@own_user_required
@require_http_methods(["GET", "POST"])
def token_revoke(request, pk: int):
    """GET asks for confirmation; POST revokes (idempotent). Another user's token is a 404."""
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    if request.method == "POST":
        revoked = revoke_token(token)
        if revoked == 1:
            messages.success(request, f"Token {token.name} ({token.key_prefix}…) revoked.")
        elif revoked:
            messages.success(
                request, f"Token {token.name} ({token.key_prefix}…) and the tokens created with it revoked: {revoked}."
            )
        return redirect(reverse("tokens"))
    return render(request, "projects/token_revoke.html", {"token": token})


project_urlpatterns = [
    path("", project_list, name="list"),
    path("<slug:slug>/", project_detail, name="project"),
    path("<slug:slug>/requests/new/", request_new, name="request_new"),
    path("<slug:slug>/pools/<int:pk>/", pool_detail, name="pool"),
    path("<slug:slug>/pools/<int:pk>/series.json", pool_series, name="pool_series"),
]


def refusing_passwords(view):
    """A sign-in view that answers a posted password with "passwords are switched off" (LOCAL_PASSWORDS=0)."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        return password_sign_in_refused(request) or view(request, *args, **kwargs)

    return wrapped


account_urlpatterns = [
    path(
        "accounts/login/",
        scoped(Scope.PUBLIC)(
            refusing_passwords(
                auth_views.LoginView.as_view(
                    template_name="projects/login.html",
                    next_page=reverse_lazy("home"),
                    redirect_authenticated_user=True,
                )
            )
        ),
        name="login",
    ),
    path("accounts/tokens/", tokens, name="tokens"),
    path("accounts/tokens/<int:pk>/revoke/", token_revoke, name="token_revoke"),
    path("accounts/logout/", scoped(Scope.PUBLIC)(auth_views.LogoutView.as_view(next_page=LOGIN_URL)), name="logout"),
]
