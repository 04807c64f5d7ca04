"""Operator console for capacity. The cluster owns these facts: everything but Cluster is read-only.

Discovery keeps the mirror current; "Discover now" on clusters queues a run at once.
"""

from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils.translation import ngettext

from .adapters import kubernetes as kube
from .choices import MigInstanceState
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


def _count(queryset, group_by: str):
    """A correlated COUNT subquery: one number per outer row without JOIN fan-out in the outer query."""
    return Coalesce(
        Subquery(queryset.order_by().values(group_by).annotate(n=Count("pk")).values("n"), output_field=IntegerField()),
        0,
    )


class ClusterForm(forms.ModelForm):
    kubeconfig_upload = forms.CharField(
        label="Kubeconfig (paste to store encrypted)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "autocomplete": "off"}),
        help_text="Stored encrypted and never shown again; leave empty to keep the stored one.",
    )

    class Meta:
        model = Cluster
        fields = ["name", "api_endpoint", "kubeconfig_path", "kubeconfig_context", "in_cluster", "dcgm_exporter_url"]

    def clean(self):
        data = super().clean()
        text = data.get("kubeconfig_upload", "").strip()
        if text:
            try:
                kube.load_configuration(kubeconfig_text=text, context=data.get("kubeconfig_context", ""))
            except kube.ConfigError as exc:
                self.add_error("kubeconfig_upload", str(exc))
            else:
                self.instance.set_kubeconfig(text)
        elif data.get("kubeconfig_path"):
            try:
                kube.load_configuration(
                    kubeconfig_path=data["kubeconfig_path"], context=data.get("kubeconfig_context", "")
                )
            except kube.ConfigError as exc:
                self.add_error("kubeconfig_path", str(exc))
        return data


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterForm
    list_display = [
        "name",
        "status",
        "node_count",
        "gpu_count",
        "last_success_at",
        "last_discovery_at",
        "short_error",
    ]
    list_filter = ["status"]
    search_fields = ["name", "api_endpoint"]
    readonly_fields = ["status", "last_discovery_at", "last_success_at", "last_error", "created_at"]
    fields = [
        "name",
        "api_endpoint",
        "kubeconfig_path",
        "kubeconfig_context",
        "kubeconfig_upload",
        "in_cluster",
        "dcgm_exporter_url",
        *readonly_fields,
    ]
    actions = ["discover_now"]

    def get_queryset(self, request):
        nodes = NodeCapacity.objects.filter(cluster=OuterRef("pk"), gone_at__isnull=True)
        gpus = GpuCapacity.objects.filter(
            node__cluster=OuterRef("pk"), node__gone_at__isnull=True, lost_at__isnull=True
        )
        return (
            super().get_queryset(request).annotate(_nodes=_count(nodes, "cluster"), _gpus=_count(gpus, "node__cluster"))
        )

    @admin.display(description="nodes", ordering="_nodes")
    def node_count(self, obj):
        return obj._nodes

    @admin.display(description="GPUs", ordering="_gpus")
    def gpu_count(self, obj):
        return obj._gpus

    @admin.display(description="last error")
    def short_error(self, obj):
        return (obj.last_error[:80] + "…") if len(obj.last_error) > 80 else obj.last_error

    @admin.action(description="Discover now", permissions=["change"])
    def discover_now(self, request, queryset):
        from .tasks import queue_discovery

        ids = list(queryset.order_by("pk").values_list("pk", flat=True))
        transaction.on_commit(lambda: [queue_discovery(pk) for pk in ids])
        self.message_user(
            request,
            ngettext("%d cluster queued for discovery.", "%d clusters queued for discovery.", len(ids)) % len(ids),
        )


@admin.register(DiscoveryRun)
class DiscoveryRunAdmin(ReadOnlyAdmin):
    list_display = [
        "cluster",
        "status",
        "started_at",
        "finished_at",
        "nodes_seen",
        "gpus_seen",
        "nodes_gone",
        "short_error",
    ]
    list_filter = ["status", "cluster"]
    list_select_related = ["cluster"]
    search_fields = ["cluster__name", "error"]
    show_full_result_count = False

    @admin.display(description="error")
    def short_error(self, obj):
        return (obj.error[:80] + "…") if len(obj.error) > 80 else obj.error


class GpuInline(admin.TabularInline):
    model = GpuCapacity
    fields = ["index", "uuid", "product", "memory_mib", "mig_mode_current", "health", "lost_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


class SpecInline(admin.TabularInline):
    model = SpecAndCount
    fields = ["resource_name", "kind", "product", "profile_name", "count", "allocatable", "replicas"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class NodeStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [
            ("present", "Present"),
            ("schedulable", "Schedulable"),
            ("not_ready", "Not ready"),
            ("cordoned", "Cordoned"),
            ("gone", "Gone"),
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "present":
            return queryset.present()
        if value == "schedulable":
            return queryset.schedulable()
        if value == "not_ready":
            return queryset.present().filter(ready=False)
        if value == "cordoned":
            return queryset.present().filter(cordoned=True)
        if value == "gone":
            return queryset.filter(gone_at__isnull=False)
        return queryset


@admin.register(NodeCapacity)
class NodeCapacityAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "cluster",
        "gpu_product",
        "gpu_count",
        "gpus_present",
        "mig_instance_count",
        "tier",
        "node_group",
        "mig_config",
        "mig_config_state",
        "ready",
        "cordoned",
        "last_seen_at",
        "gone_at",
    ]
    list_filter = [NodeStateFilter, "cluster", "gpu_product", "tier", "mig_strategy", "node_group"]
    list_select_related = ["cluster"]
    search_fields = ["name", "gpu_product", "node_group"]
    show_full_result_count = False
    inlines = [SpecInline, GpuInline]

    def get_queryset(self, request):
        # Correlated subqueries, not JOINs: joining GPUs and MIG instances would multiply the rows
        # of a 2,000-node changelist before grouping.
        gpus = GpuCapacity.objects.filter(node=OuterRef("pk"), lost_at__isnull=True)
        migs = MigInstance.objects.filter(
            gpu__node=OuterRef("pk"), gpu__lost_at__isnull=True, state=MigInstanceState.ACTIVE
        )
        return super().get_queryset(request).annotate(_gpus=_count(gpus, "node"), _migs=_count(migs, "gpu__node"))

    @admin.display(description="GPUs (NVML)", ordering="_gpus")
    def gpus_present(self, obj):
        return obj._gpus

    @admin.display(description="MIG instances", ordering="_migs")
    def mig_instance_count(self, obj):
        return obj._migs


@admin.register(GpuCapacity)
class GpuCapacityAdmin(ReadOnlyAdmin):
    list_display = [
        "uuid",
        "node",
        "index",
        "product",
        "memory_mib",
        "mig_mode_current",
        "health",
        "driver_version",
        "last_seen_at",
        "lost_at",
    ]
    list_filter = [
        "node__cluster",
        "catalog_product",
        "health",
        "mig_mode_current",
        ("lost_at", admin.EmptyFieldListFilter),
    ]
    list_select_related = ["node__cluster"]
    search_fields = ["uuid", "serial", "node__name", "pci_bus_id"]
    show_full_result_count = False


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
    list_display = ["uuid", "profile", "node", "gpu", "placement_start", "placement_size", "gi_id", "ci_id", "state"]
    list_filter = ["state", "gpu__node__cluster", "profile__product", "profile__name"]
    list_select_related = ["profile", "gpu__node__cluster"]
    search_fields = ["uuid", "gpu__uuid", "gpu__node__name"]
    show_full_result_count = False

    @admin.display(description="node", ordering="gpu__node__name")
    def node(self, obj):
        return obj.gpu.node.name


@admin.register(SpecAndCount)
class SpecAndCountAdmin(ReadOnlyAdmin):
    list_display = ["node", "kind", "product", "profile_name", "resource_name", "count", "allocatable", "replicas"]
    list_filter = ["kind", "product", "profile_name", "node__cluster", "node__tier"]
    list_select_related = ["node__cluster"]
    search_fields = ["node__name", "resource_name"]
    show_full_result_count = False


@admin.register(WorkloadProfile)
class WorkloadProfileAdmin(ReadOnlyAdmin):
    list_display = [
        "pod_name",
        "namespace",
        "project",
        "cluster",
        "node",
        "resource_name",
        "count",
        "device",
        "started_at",
        "ended_at",
    ]
    list_filter = ["cluster", "resource_name", "project", ("ended_at", admin.EmptyFieldListFilter)]
    list_select_related = ["cluster", "node__cluster", "project", "gpu", "mig_instance__profile"]
    search_fields = ["pod_name", "namespace", "pod_uid"]
    show_full_result_count = False

    @admin.display(description="device")
    def device(self, obj):
        if obj.mig_instance_id:
            return f"{obj.mig_instance.profile.name} {obj.mig_instance.uuid}"
        return obj.gpu.uuid if obj.gpu_id else ""


# --- MIG reconfiguration, layouts, maintenance windows, time-slicing -------------------------------
# Registers its own admins and re-registers the GPU and node admins above as subclasses that add the
# MIG layout pictures (capacity/admin_reconfig.py).
from . import admin_reconfig  # noqa: E402, F401
