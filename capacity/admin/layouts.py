"""Operator console for what gpuaas decides about capacity: MIG layouts, maintenance windows, time-slicing
policies and tiers (registered when capacity.admin imports this module)."""

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext

from .. import tiers
from ..mig.catalog import PRODUCTS
from ..mig.layout import validate_layout
from ..mig_picture import gpu_layout_html, legend_html
from ..models import (
    SHARING_POLICY_FIELDS,
    GpuCapacity,
    MaintenanceWindow,
    MigLayout,
    TierAssignment,
    TierProfilePolicy,
    TimeSlicingPolicy,
)
from ..services import mig_configs
from ..services import tiers as tier_services

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
