"""Operator console for capacity. The cluster owns these facts: everything but Cluster is read-only."""

from django.contrib import admin
from django.db.models import Count, Q

from .models import (
    Cluster,
    DiscoveryRun,
    GpuCapacity,
    MigInstance,
    MigPlacement,
    MigProfile,
    NodeCapacity,
    SpecAndCount,
    WorkloadProfile,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Mirror of cluster state: viewable, never edited by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "status", "node_count", "last_success_at", "last_discovery_at", "short_error"]
    list_filter = ["status"]
    search_fields = ["name", "api_endpoint"]
    readonly_fields = ["status", "last_discovery_at", "last_success_at", "last_error", "created_at"]
    fields = [
        "name",
        "api_endpoint",
        "kubeconfig_path",
        "kubeconfig_context",
        "in_cluster",
        "dcgm_exporter_url",
        *readonly_fields,
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_nodes=Count("nodes", filter=Q(nodes__gone_at__isnull=True)))

    @admin.display(description="nodes", ordering="_nodes")
    def node_count(self, obj):
        return obj._nodes

    @admin.display(description="last error")
    def short_error(self, obj):
        return (obj.last_error[:80] + "…") if len(obj.last_error) > 80 else obj.last_error


@admin.register(DiscoveryRun)
class DiscoveryRunAdmin(ReadOnlyAdmin):
    list_display = ["cluster", "status", "started_at", "finished_at", "nodes_seen", "gpus_seen", "nodes_gone"]
    list_filter = ["status", "cluster"]
    list_select_related = ["cluster"]
    search_fields = ["cluster__name", "error"]


class GpuInline(admin.TabularInline):
    model = GpuCapacity
    fields = ["index", "uuid", "product", "memory_mib", "mig_mode_current", "health", "lost_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(NodeCapacity)
class NodeCapacityAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "cluster",
        "gpu_product",
        "gpu_count",
        "mig_instance_count",
        "tier",
        "ready",
        "cordoned",
        "last_seen_at",
        "gone_at",
    ]
    list_filter = ["cluster", "gpu_product", "tier", "ready", "cordoned", ("gone_at", admin.EmptyFieldListFilter)]
    list_select_related = ["cluster"]
    search_fields = ["name", "gpu_product"]
    inlines = [GpuInline]

    def get_queryset(self, request):
        return super().get_queryset(request).with_counts()

    @admin.display(description="MIG instances", ordering="mig_instances")
    def mig_instance_count(self, obj):
        return obj.mig_instances


@admin.register(GpuCapacity)
class GpuCapacityAdmin(ReadOnlyAdmin):
    list_display = ["uuid", "node", "index", "product", "memory_mib", "mig_mode_current", "health", "lost_at"]
    list_filter = ["product", "health", "mig_mode_current", "node__cluster"]
    list_select_related = ["node__cluster"]
    search_fields = ["uuid", "serial", "node__name", "pci_bus_id"]


@admin.register(MigProfile)
class MigProfileAdmin(ReadOnlyAdmin):
    list_display = ["product", "name", "profile_id", "compute_slices", "memory_slices", "memory_mib", "max_instances"]
    list_filter = ["product", "compute_slices"]
    search_fields = ["name", "product"]


@admin.register(MigPlacement)
class MigPlacementAdmin(ReadOnlyAdmin):
    list_display = ["profile", "start", "size"]
    list_filter = ["profile__product"]
    list_select_related = ["profile"]
    search_fields = ["profile__name"]


@admin.register(MigInstance)
class MigInstanceAdmin(ReadOnlyAdmin):
    list_display = ["uuid", "profile", "gpu", "placement_start", "placement_size", "gi_id", "state"]
    list_filter = ["state", "profile__product", "profile__name"]
    list_select_related = ["profile", "gpu__node__cluster"]
    search_fields = ["uuid", "gpu__uuid"]


@admin.register(SpecAndCount)
class SpecAndCountAdmin(ReadOnlyAdmin):
    list_display = ["node", "kind", "product", "profile_name", "resource_name", "count", "allocatable", "replicas"]
    list_filter = ["kind", "product", "profile_name", "node__cluster"]
    list_select_related = ["node__cluster"]
    search_fields = ["node__name", "resource_name"]


@admin.register(WorkloadProfile)
class WorkloadProfileAdmin(ReadOnlyAdmin):
    list_display = ["pod_name", "namespace", "cluster", "node", "resource_name", "project", "started_at", "ended_at"]
    list_filter = ["cluster", "resource_name", ("ended_at", admin.EmptyFieldListFilter)]
    list_select_related = ["cluster", "node__cluster", "project"]
    search_fields = ["pod_name", "namespace", "pod_uid"]
