"""Operator console for capacity. The cluster owns these facts: the mirror is read-only.

Discovery keeps the mirror current; "Discover now" on clusters queues a run at once. Operators edit
only what gpuaas decides: clusters, MIG layouts, maintenance windows and time-slicing policies. The
GPU and node pages show the MIG layout pictures; MIG reconfigurations have their console in
operations/admin.py.
"""

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext

from core.admin_paging import FleetScaleAdminMixin
from core.admin_permissions import ReadOnlyAdminMixin, ReadOnlyInline

from . import tiers
from .adapters import kubernetes as kube
from .admin_onboarding import OnboardingAdminMixin
from .choices import MigInstanceState
from .mig.catalog import PRODUCTS
from .mig.layout import validate_layout
from .mig_picture import gpu_layout_html, gpu_picture, legend_html, node_pictures
from .models import (
    SHARING_POLICY_FIELDS,
    Cluster,
    ClusterOnboarding,
    DiscoveryRun,
    GpuCapacity,
    MaintenanceWindow,
    MigInstance,
    MigLayout,
    MigPlacement,
    MigProfile,
    MigReconfiguration,
    NodeCapacity,
    SpecAndCount,
    TierAssignment,
    TierProfilePolicy,
    TimeSlicingPolicy,
    WorkloadProfile,
)
from .services import mig_configs
from .services import tiers as tier_services
from .tasks import queue_discovery


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


# --- MIG layouts, maintenance windows and time-slicing ------------------------------------------------

TIME_SLICING_WARNING = (
    "Time-slicing has NO memory isolation: every replica sees and can exhaust the whole GPU's memory, "
    "and a crash or an out-of-memory error in one pod can take the others down. Use MIG where isolation matters."
)


class MigLayoutForm(forms.ModelForm):
    product = forms.ChoiceField(choices=[(k, k) for k in PRODUCTS])

    class Meta:
        model = MigLayout
        fields = ["name", "product", "gpus", "description"]
        widgets = {"gpus": forms.Textarea(attrs={"rows": 4, "cols": 80})}


@admin.register(MigLayout)
class MigLayoutAdmin(admin.ModelAdmin):
    form = MigLayoutForm
    list_display = ["name", "product", "config_name", "summary", "updated_at"]
    list_filter = ["product"]
    search_fields = ["name", "description"]
    readonly_fields = ["config_name", "mig_parted_entries", "pictures"]

    @admin.display(description="layout")
    def summary(self, obj):
        return "; ".join(f"{k}: {'MIG off' if v is None else ','.join(v) or 'empty'}" for k, v in obj.gpus.items())

    @admin.display(description="mig-parted entries (as written to the ConfigMap)")
    def mig_parted_entries(self, obj):
        if not obj.pk:
            return "-"
        text = mig_configs.dump_yaml({obj.config_name: mig_configs.entries_for_targets(obj.product, obj.gpus)})
        return format_html("<pre>{}</pre>", text)

    @admin.display(description="picture")
    def pictures(self, obj):
        if not obj.pk:
            return "-"
        out = []
        for key, names in obj.gpus.items():
            if names is None:
                out.append(gpu_layout_html(obj.product, [], mig=False, title=f"GPU {key}"))
                continue
            result = validate_layout(obj.product, names)
            placements = [dict(p.to_dict(), state="planned") for p in result.placements]
            out.append(gpu_layout_html(obj.product, placements, title=f"GPU {key}"))
        return format_html("{}{}", legend_html(), mark_safe("".join(out)))

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        mig_configs.publish()

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        mig_configs.publish()


# --- Maintenance windows and time-slicing --------------------------------------------------------


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(admin.ModelAdmin):
    list_display = ["__str__", "cluster", "node_group", "name", "enabled", "open_now"]
    list_filter = ["cluster", "enabled"]
    list_select_related = ["cluster"]
    search_fields = ["name", "node_group", "cluster__name"]

    @admin.display(description="open now", boolean=True)
    def open_now(self, obj):
        return obj.is_open(timezone.now())


class TimeSlicingPolicyForm(forms.ModelForm):
    class Meta:
        model = TimeSlicingPolicy
        fields = list(SHARING_POLICY_FIELDS)
        help_texts = {"replicas": "Pods (MPS: clients) per GPU, i.e. tier-3 slots per GPU. " + TIME_SLICING_WARNING}


@admin.register(TimeSlicingPolicy)
class TimeSlicingPolicyAdmin(admin.ModelAdmin):
    form = TimeSlicingPolicyForm
    list_display = [
        "__str__",
        "strategy",
        "config_key",
        "replicas",
        "tier3_slots",
        "enabled",
        "applied_at",
        "nodes_labelled",
    ]
    list_filter = ["cluster", "strategy", "enabled"]
    list_select_related = ["cluster"]
    search_fields = ["node_group", "cluster__name"]
    readonly_fields = [
        "isolation_warning",
        "config_key",
        "client_environment",
        "applied_at",
        "nodes_labelled",
        "last_error",
    ]
    actions = ["apply_to_cluster"]

    @admin.display(description="memory isolation")
    def isolation_warning(self, obj):
        return format_html('<strong style="color:#ba2121">{}</strong>', TIME_SLICING_WARNING)

    @admin.display(description="tier-3 slots")
    def tier3_slots(self, obj):
        gpus = GpuCapacity.objects.present().filter(node__cluster_id=obj.cluster_id)
        if obj.node_group:
            gpus = gpus.filter(node__node_group=obj.node_group)
        return gpus.count() * obj.replicas

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        messages.warning(request, TIME_SLICING_WARNING)
        return super().changeform_view(request, object_id, form_url, extra_context)

    @admin.action(description="Write the ConfigMap and label the nodes", permissions=["change"])
    def apply_to_cluster(self, request, queryset):
        clusters = sorted(set(queryset.values_list("cluster_id", flat=True)))
        for cluster_id in clusters:
            mig_configs.enqueue_time_slicing(cluster_id)
        self.message_user(request, ngettext("%d cluster queued.", "%d clusters queued.", len(clusters)) % len(clusters))


@admin.register(TierAssignment)
class TierAssignmentAdmin(admin.ModelAdmin):
    """Nodes whose tier gpuaas owns: saving writes the gpuaas.io/tier label (after commit) and keeps it."""

    list_display = ["node", "tier", "assigned_by", "assigned_at", "labelled_at", "last_error"]
    list_filter = ["tier", "node__cluster"]
    list_select_related = ["node__cluster", "assigned_by"]
    search_fields = ["node__name"]
    autocomplete_fields = ["node"]
    readonly_fields = ["assigned_by", "labelled_at", "last_error"]
    actions = ["reconcile_labels"]

    def save_model(self, request, obj, form, change):
        tier_services.assign_tier(obj.node, obj.tier, actor=request.user)
        obj.refresh_from_db()

    def delete_model(self, request, obj):
        tier_services.unassign_tier(obj.node)

    def delete_queryset(self, request, queryset):
        for assignment in queryset.select_related("node"):
            tier_services.unassign_tier(assignment.node)

    @admin.action(description="Write or restore the tier labels of the selected clusters", permissions=["change"])
    def reconcile_labels(self, request, queryset):
        clusters = sorted(set(queryset.values_list("node__cluster_id", flat=True)))
        with transaction.atomic():
            for cluster_id in clusters:
                tier_services.enqueue_tier_labels(cluster_id)
        self.message_user(request, ngettext("%d cluster queued.", "%d clusters queued.", len(clusters)) % len(clusters))


@admin.register(TierProfilePolicy)
class TierProfilePolicyAdmin(admin.ModelAdmin):
    """Which MIG profiles each tier carries. Every tier has a row (the built-in defaults were written as rows,
    saying so in their notes); approval and every availability screen obey them (capacity/tiers.py)."""

    list_display = ["tier_label", "admits", "min_compute_slices", "max_compute_slices", "notes", "updated_at"]
    list_editable = ["min_compute_slices", "max_compute_slices"]
    list_display_links = ["tier_label"]
    fields = ["tier", "min_compute_slices", "max_compute_slices", "notes", "default", "updated_at"]
    readonly_fields = ["default", "updated_at"]

    @admin.display(description="Tier", ordering="tier")
    def tier_label(self, obj: TierProfilePolicy) -> str:
        return obj.get_tier_display()

    @admin.display(description="Admits")
    def admits(self, obj: TierProfilePolicy) -> str:
        """The rule as every screen says it: "tier 1 takes 3g and larger"."""
        return tiers.rule(obj.tier, {obj.tier: obj.policy})

    @admin.display(description="Built-in default")
    def default(self, obj: TierProfilePolicy) -> str:
        return tiers.rule(obj.tier, tiers.DEFAULT_POLICIES)
