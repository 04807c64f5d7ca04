"""The operator dashboard's pages and JSON endpoints, mounted in the admin (operators only).

Each page renders its first data inline (json_script) and then re-fetches its JSON endpoint every
15 seconds; the endpoints are wrapped in admin_site.admin_view like the pages, so a non-staff user
is sent to the admin login and never sees a number, and staff without DASHBOARD_PERMISSIONS get 403.
"""

from __future__ import annotations

from django.http import JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from capacity.models import Cluster, GpuCapacity
from core.scopes import Scope, scoped

from . import crosscheck, fleet, nodes, timeseries

REFRESH_S = 15
# The dashboard shows the fleet and every project's pools: staff without these get the admin's 403.
DASHBOARD_PERMISSIONS = ("capacity.view_nodecapacity", "pools.view_gpupool")


def _json(data: dict) -> JsonResponse:
    return JsonResponse(data)  # admin_view adds never_cache


def _page(request, admin_site, template: str, title: str, data: dict, data_url: str, **extra) -> TemplateResponse:
    context = admin_site.each_context(request) | {
        "title": title,
        "data": data,
        "data_url": data_url,
        "refresh_s": REFRESH_S,
        **extra,
    }
    return TemplateResponse(request, template, context)


def cluster_view_data(cluster: Cluster, page: str | int) -> dict:
    return nodes.node_view(cluster, page) | {"series": timeseries.cluster_series([cluster])}


def gpu_view_data(gpu: GpuCapacity) -> dict:
    return nodes.gpu_picture(gpu) | {"series": timeseries.gpu_series(gpu)}


def urlpatterns(admin_site) -> list:
    """The dashboard's admin URLs, each behind admin_site.admin_view and DASHBOARD_PERMISSIONS."""

    def overview_page(request):
        return _page(
            request,
            admin_site,
            "dashboard/overview.html",
            "GPU dashboard",
            fleet.overview(),
            reverse("admin:gpuaas_dashboard_data"),
        )

    def overview_data(request):
        return _json(fleet.overview())

    def cluster_page(request, pk: int):
        cluster = get_object_or_404(Cluster, pk=pk)
        page = request.GET.get("page", 1)
        data_url = reverse("admin:gpuaas_dashboard_cluster_data", args=[pk]) + f"?page={page}"
        return _page(
            request,
            admin_site,
            "dashboard/cluster.html",
            f"Node view: {cluster.name}",
            cluster_view_data(cluster, page),
            data_url,
            cluster=cluster,
        )

    def cluster_data(request, pk: int):
        cluster = get_object_or_404(Cluster, pk=pk)
        return _json(cluster_view_data(cluster, request.GET.get("page", 1)))

    def gpu_page(request, pk: int):
        gpu = get_object_or_404(GpuCapacity.objects.annotate_availability().select_related("node__cluster"), pk=pk)
        return _page(
            request,
            admin_site,
            "dashboard/gpu.html",
            f"GPU {gpu.index} on {gpu.node.name}",
            gpu_view_data(gpu),
            reverse("admin:gpuaas_dashboard_gpu_data", args=[pk]),
            gpu=gpu,
        )

    def gpu_data(request, pk: int):
        gpu = get_object_or_404(GpuCapacity.objects.annotate_availability().select_related("node__cluster"), pk=pk)
        return _json(gpu_view_data(gpu))

    def crosscheck_data(request):
        """Do the screens agree on availability? `bench demo-soak` and the browser test read this."""
        found = crosscheck.contradictions()
        return _json({"contradictions": len(found), "items": found})

    def wrap(view):
        return admin_site.admin_view(scoped(Scope.OPERATOR, *DASHBOARD_PERMISSIONS)(view))

    return [
        path("dashboard/", wrap(overview_page), name="gpuaas_dashboard"),
        path("dashboard/data.json", wrap(overview_data), name="gpuaas_dashboard_data"),
        path("dashboard/clusters/<int:pk>/", wrap(cluster_page), name="gpuaas_dashboard_cluster"),
        path("dashboard/clusters/<int:pk>/data.json", wrap(cluster_data), name="gpuaas_dashboard_cluster_data"),
        path("dashboard/gpus/<int:pk>/", wrap(gpu_page), name="gpuaas_dashboard_gpu"),
        path("dashboard/gpus/<int:pk>/data.json", wrap(gpu_data), name="gpuaas_dashboard_gpu_data"),
        path("dashboard/crosscheck.json", wrap(crosscheck_data), name="gpuaas_dashboard_crosscheck"),
    ]
