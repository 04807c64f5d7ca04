"""Operator console for rolling driver upgrades (operations.models.DriverUpgrade).

Start one on the add page (cluster, then a node group or a list of nodes, or every GPU node; mode and
max_parallel default from the cluster's ClusterPolicy); follow it on the change list (progress, failed
nodes, current wave, next window) and on its page (each node read-only, with its drain); pause, resume or
cancel with the actions, which call the services. Registered from operations/admin.py.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils.html import format_html

from capacity.models import NodeCapacity
from core.admin_permissions import OperatorActionsMixin, ReadOnlyInline
from operations.choices import UpgradeMode

from .admin_actions import StartedOnAddPageMixin, WorkflowActionsMixin
from .maintenance import rollout
from .models import DriverUpgrade, DriverUpgradeNode


class StartUpgradeForm(forms.ModelForm):
    """The add page: field errors (empty selection, a node in another open rollout) before anything is written."""

    nodes = forms.ModelMultipleChoiceField(
        queryset=NodeCapacity.objects.none(), required=False, help_text="Empty: the node group's, else every GPU node."
    )
    mode = forms.ChoiceField(
        choices=[("", "From the ClusterPolicy (autoUpgrade)"), *UpgradeMode.choices], required=False
    )
    max_parallel = forms.IntegerField(
        min_value=1, required=False, help_text="Empty: ClusterPolicy maxParallelUpgrades."
    )
    grace_s = forms.IntegerField(min_value=0, required=False, help_text="Empty: MAINTENANCE_GRACE_S.")

    class Meta:
        model = DriverUpgrade
        fields = ["cluster", "node_group", "name"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "nodes" in self.fields:
            self.fields["nodes"].queryset = NodeCapacity.objects.present().select_related("cluster").order_by("name")

    def clean(self):
        data = super().clean()
        cluster = data.get("cluster")
        if cluster is not None:
            try:
                rollout.select_nodes(
                    cluster, nodes=list(data.get("nodes") or ()), node_group=data.get("node_group", "")
                )
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    self.add_error(field if field in self.fields else None, errors)
        return data


class UpgradeNodeInline(ReadOnlyInline):
    model = DriverUpgradeNode
    fields = ["node", "wave", "state", "drain_link", "draining_at", "upgrading_at", "done_at", "failed_at", "error"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("node", "drain")

    @admin.display(description="drain")
    def drain_link(self, obj):
        if obj.drain_id is None:
            return "-"
        url = reverse("admin:capacity_nodedrain_change", args=[obj.drain_id])
        return format_html('<a href="{}">#{} {}</a>', url, obj.drain_id, obj.drain.phase)


@admin.register(DriverUpgrade)
class DriverUpgradeAdmin(StartedOnAddPageMixin, WorkflowActionsMixin, OperatorActionsMixin, admin.ModelAdmin):
    action_nouns = ("rollout", "rollouts")
    list_display = [
        "id",
        "name",
        "cluster",
        "state",
        "mode",
        "progress",
        "failed",
        "current_wave",
        "max_parallel",
        "next_window_at",
        "created_at",
    ]
    list_filter = ["state", "mode", "cluster"]
    list_select_related = ["cluster"]
    search_fields = ["name", "cluster__name", "nodes__node__name"]
    inlines = [UpgradeNodeInline]
    actions = ["pause_selected", "resume_selected", "cancel_selected"]
    form = StartUpgradeForm
    start_fields = ["cluster", "node_group", "nodes", "name", "mode", "max_parallel", "grace_s"]
    readonly_fields = [
        *DriverUpgrade.SETTINGS_FIELDS,
        "state",
        "current_wave",
        "progress",
        "failed",
        "waiting_for",
        "next_window_at",
        "started_at",
        "finished_at",
        "error",
        "created_by",
        "created_at",
    ]

    def get_queryset(self, request):
        # Per-state node counts as aggregates of one query, not a count per row.
        return super().get_queryset(request).with_progress()

    @admin.display(description="done / total")
    def progress(self, obj):
        return f"{getattr(obj, 'nodes_done', 0)} / {getattr(obj, 'nodes_total', 0)}"

    @admin.display(description="failed nodes")
    def failed(self, obj):
        return getattr(obj, "nodes_failed", 0)

    def save_model(self, request, obj, form, change):
        """Create it through the service (the form showed the field errors; a race still refuses here)."""
        data = form.cleaned_data
        upgrade = rollout.create(
            data["cluster"],
            nodes=list(data.get("nodes") or ()) or None,
            node_group=data.get("node_group", ""),
            name=data.get("name", ""),
            mode=data.get("mode") or None,
            max_parallel=data.get("max_parallel"),
            grace_s=data.get("grace_s"),
            actor=request.user,
        )
        obj.pk, obj.created_at = upgrade.pk, upgrade.created_at

    def save_related(self, request, form, formsets, change):
        """Nothing to save: the service wrote the rollout and its nodes."""

    @admin.action(description="Pause (no new wave starts)", permissions=["operate"])
    def pause_selected(self, request, queryset):
        self._each(request, queryset, rollout.pause, "paused")

    @admin.action(description="Resume", permissions=["operate"])
    def resume_selected(self, request, queryset):
        self._each(request, queryset, rollout.resume, "resumed")

    @admin.action(description="Cancel (nodes not started stay as they are)", permissions=["operate"])
    def cancel_selected(self, request, queryset):
        self._each(request, queryset, rollout.cancel, "cancelled")
