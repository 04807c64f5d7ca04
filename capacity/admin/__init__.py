"""Operator console for capacity. The cluster owns these facts: the mirror is read-only.

Discovery keeps the mirror current; "Discover now" on clusters queues a run at once. Operators edit
only what gpuaas decides: clusters, MIG layouts, maintenance windows and time-slicing policies. The
GPU and node pages show the MIG layout pictures; the pages of what gpuaas decides (layouts, windows,
time-slicing, tiers) are admin/layouts.py; MIG reconfigurations have their console in operations/admin.py.
"""

from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import ngettext

from core.admin_paging import FleetScaleAdminMixin
from core.admin_permissions import ReadOnlyAdminMixin, ReadOnlyInline

from ..adapters import kubernetes as kube
from ..choices import MigInstanceState
from ..mig_picture import gpu_picture, node_pictures
from ..models import (
    Cluster,
    ClusterOnboarding,
    DiscoveryRun,
    GpuCapacity,
    MigInstance,
    MigPlacement,
    MigProfile,
    MigReconfiguration,
    NodeCapacity,
    SpecAndCount,
    WorkloadProfile,
)
from ..tasks import queue_discovery
from . import (
    layouts,  # noqa: F401 (registers the layouts, windows, time-slicing and tiers pages)
)
from .onboarding import OnboardingAdminMixin


class ReadOnlyAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Mirror of cluster state: viewable, never edited by hand."""


def _count(queryset, group_by: str):
    """A correlated COUNT subquery: one number per outer row without JOIN fan-out in the outer query."""
    return Coalesce(
        Subquery(queryset.order_by().values(group_by).annotate(n=Count("pk")).values("n"), output_field=IntegerField()),
        0,
    )


class PictureFieldsetMixin:
    """One more computed read-only field (`picture_field`, a method of the admin) in its own fieldset
    at the end of the change page: the MIG layout pictures of GPUs and nodes."""

    picture_field: str
    picture_label: str

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), self.picture_field]

    def get_fieldsets(self, request, obj=None):
        fieldsets = [
            (name, {**opts, "fields": [f for f in opts["fields"] if f != self.picture_field]})
            for name, opts in super().get_fieldsets(request, obj)
        ]
        return [*fieldsets, (self.picture_label, {"fields": [self.picture_field]})]


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
class ClusterAdmin(OnboardingAdminMixin, admin.ModelAdmin):
    form = ClusterForm
    list_display = [
        "name",
        "status",
        "binding",
        "node_count",
        "gpu_count",
        "last_success_at",
        "last_discovery_at",
        "short_error",
    ]
    list_filter = ["status", "binding"]
    search_fields = ["name", "api_endpoint"]
    readonly_fields = [
        "status",
        "binding",
        "last_discovery_at",
        "last_success_at",
        "last_error",
        "created_at",
        "onboarding_link",
        "agent_health_table",
    ]
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
        ids = list(queryset.order_by("pk").values_list("pk", flat=True))
        transaction.on_commit(lambda: [queue_discovery(pk) for pk in ids])
        self.message_user(
            request,
            ngettext("%d cluster queued for discovery.", "%d clusters queued for discovery.", len(ids)) % len(ids),
        )


@admin.register(ClusterOnboarding)
class ClusterOnboardingAdmin(ReadOnlyAdmin):
    """The onboarding audit: who applied what into which cluster, and the cluster's error when it failed."""

    list_display = ["cluster", "status", "actor", "force", "started_at", "finished_at", "error"]
    list_filter = ["status", "cluster"]
    list_select_related = ["cluster", "actor"]


@admin.register(DiscoveryRun)
class DiscoveryRunAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
    list_display = [*DiscoveryRun.SUMMARY_FIELDS, "short_error"]
    list_filter = ["status", "cluster"]
    list_select_related = ["cluster"]
    search_fields = ["cluster__name", "error"]

    @admin.display(description="error")
    def short_error(self, obj):
        return (obj.error[:80] + "…") if len(obj.error) > 80 else obj.error


class GpuInline(ReadOnlyInline):
    model = GpuCapacity
    fields = ["index", "uuid", "product", "memory_mib", "mig_mode_current", "health", "lost_at"]
    show_change_link = True


class SpecInline(ReadOnlyInline):
    model = SpecAndCount
    fields = ["resource_name", "kind", "product", "profile_name", "count", "allocatable", "replicas"]


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
class NodeCapacityAdmin(FleetScaleAdminMixin, PictureFieldsetMixin, ReadOnlyAdmin):
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

    picture_field, picture_label = "mig_layout_pictures", "MIG layouts"

    @admin.display(description="MIG layouts")
    def mig_layout_pictures(self, obj):
        """A "Reconfigure MIG" button, the open reconfiguration if any, and each GPU's layout."""
        if obj is None or not obj.pk:
            return "-"
        link = format_html(
            '<p><a class="button" href="{}?node={}">Reconfigure MIG on this node</a></p>',
            reverse("admin:capacity_migreconfiguration_add"),
            obj.pk,
        )
        open_ = MigReconfiguration.objects.open().filter(node=obj).first()
        note = (
            format_html(
                '<p>Open reconfiguration: <a href="{}">#{} ({}/{})</a></p>',
                reverse("admin:capacity_migreconfiguration_change", args=[open_.pk]),
                open_.pk,
                open_.step,
                open_.state,
            )
            if open_
            else ""
        )
        return format_html("{}{}{}", link, note, node_pictures(obj))


@admin.register(GpuCapacity)
class GpuCapacityAdmin(FleetScaleAdminMixin, PictureFieldsetMixin, ReadOnlyAdmin):
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
    picture_field, picture_label = "mig_layout_picture", "MIG layout"

    @admin.display(description="MIG layout")
    def mig_layout_picture(self, obj):
        return gpu_picture(obj) if obj is not None and obj.pk else "-"


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
class MigInstanceAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
    list_display = ["uuid", "profile", "node", "gpu", "placement_start", "placement_size", "gi_id", "ci_id", "state"]
    list_filter = ["state", "gpu__node__cluster", "profile__product", "profile__name"]
    list_select_related = ["profile", "gpu__node__cluster"]
    search_fields = ["uuid", "gpu__uuid", "gpu__node__name"]

    @admin.display(description="node", ordering="gpu__node__name")
    def node(self, obj):
        return obj.gpu.node.name


@admin.register(SpecAndCount)
class SpecAndCountAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
    list_display = ["node", "kind", "product", "profile_name", "resource_name", "count", "allocatable", "replicas"]
    list_filter = ["kind", "product", "profile_name", "node__cluster", "node__tier"]
    list_select_related = ["node__cluster"]
    search_fields = ["node__name", "resource_name"]


@admin.register(WorkloadProfile)
class WorkloadProfileAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
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

    @admin.display(description="device")
    def device(self, obj):
        if obj.mig_instance_id:
            return f"{obj.mig_instance.profile.name} {obj.mig_instance.uuid}"
        return obj.gpu.uuid if obj.gpu_id else ""
