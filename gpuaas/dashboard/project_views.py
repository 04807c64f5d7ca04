"""The project view for project members, outside the admin: /projects/ (login required, session auth).

Scoped with pools.roles.projects_for(user): another project's page or pool is a 404, never a 403.
"""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import path, reverse_lazy
from django.views.decorators.cache import never_cache

from pools.models import Allocation, GpuPool
from pools.roles import projects_for

from . import projects, sources

LOGIN_URL = reverse_lazy("login")
member_required = login_required(login_url=LOGIN_URL)


def _scoped_project(user, slug: str):
    project = projects.project_of_user(user, slug)
    if project is None:
        raise Http404("No such project")
    return project


def table_rows(panel: dict) -> dict:
    """A server panel with its items laid out as rows of cells, for a template to print."""
    if not panel.get("available"):
        return panel
    columns = panel["columns"]
    rows = [[{"value": item.get(c["key"]), "num": c.get("num", False)} for c in columns] for item in panel["items"]]
    return panel | {"rows": rows}


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
            "profiles": projects.profile_distribution(Allocation.objects.filter(project__in=scope)),
            "costs": table_rows(sources.month_costs(project_ids)),
        },
    )


@member_required
def project_list(request):
    """All the user's projects: their pools as cards, their requests and this month's costs."""
    return _overview(request, projects.visible_projects(request.user))


@member_required
def project_detail(request, slug: str):
    project = _scoped_project(request.user, slug)
    return _overview(request, projects_for(request.user).filter(pk=project.pk), project)


def _scoped_pool(user, slug: str, pk: int) -> GpuPool:
    project = _scoped_project(user, slug)
    return get_object_or_404(GpuPool.objects.select_related("project", "cluster", "request"), pk=pk, project=project)


@member_required
def pool_detail(request, slug: str, pk: int):
    """A pool's card with two tabs: Allocation (its units by node) and Monitoring (SM activity and power)."""
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
            "series": sources.pool_series(pool),
        },
    )


@never_cache
@member_required
def pool_series(request, slug: str, pk: int):
    """The monitoring tab's chart data, re-fetched every 15 s."""
    return JsonResponse(sources.pool_series(_scoped_pool(request.user, slug, pk)))


project_urlpatterns = [
    path("", project_list, name="list"),
    path("<slug:slug>/", project_detail, name="project"),
    path("<slug:slug>/pools/<int:pk>/", pool_detail, name="pool"),
    path("<slug:slug>/pools/<int:pk>/series.json", pool_series, name="pool_series"),
]

account_urlpatterns = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="projects/login.html", next_page=reverse_lazy("projects:list")),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page=LOGIN_URL), name="logout"),
]
