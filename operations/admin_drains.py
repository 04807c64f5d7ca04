"""Operator console for drain-and-move (operations/maintenance): start a drain on the add page, follow it,
give the node back or resume it. Registered by operations.admin (which imports this module)."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from capacity.models import MigReconfiguration, NodeCapacity, NodeDrain, NodeDrainStep
from core.admin_permissions import OperatorActionsMixin
from policies import policy

from . import maintenance
from .admin_actions import StartedOnAddPageMixin, TrailInline, WorkflowActionsMixin


class StartDrainForm(forms.ModelForm):
    """Node, reason and notice; clean() shows the refusal (with the shortfall) before anything is written."""

    class Meta:
        model = NodeDrain
        fields = ["node", "reason", "grace_s"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "node" in self.fields:  # the add page; a drain's own page shows it read-only
            self.fields["node"].queryset = NodeCapacity.objects.present().select_related("cluster")
            self.fields["grace_s"].initial = policy("MAINTENANCE_GRACE_S")

    def clean(self):
        data = super().clean()
        node = data.get("node")
        if node is not None:
            check = maintenance.take_offline_check(nodes=[node])
            if not check.covered:
                short = ", ".join(f"{n} x {unit}" for unit, n in check.shortfall.items())
                raise ValidationError(f"The free reserve cannot absorb {node}'s reservations: short of {short}.")
            if MigReconfiguration.objects.open().filter(node=node).exists():
                raise ValidationError({"node": f"{node} has an open MIG reconfiguration."})
        return data


class DrainStepInline(TrailInline):
    model = NodeDrainStep


@admin.register(NodeDrain)
class NodeDrainAdmin(StartedOnAddPageMixin, WorkflowActionsMixin, OperatorActionsMixin, admin.ModelAdmin):
    action_nouns = ("drain", "drains")
    action_related = ("cluster", "node")
    """Start a drain on the add page; follow its phase, moves and trail; give the node back or resume."""

    list_display = ["id", "node", "phase", "reason", "moved", "evict_after", "created_by", "created_at"]
    list_filter = ["state", "step", "cluster"]
    list_select_related = ["node__cluster", "created_by"]
    search_fields = ["node__name", "reason", "error"]
    inlines = [DrainStepInline]
    actions = ["give_back_selected", "resume_selected"]
    form = StartDrainForm
    start_fields = ["node", "reason", "grace_s"]
    readonly_fields = [
        "cluster",
        "node",
        "reason",
        "grace_s",
        "evict_after",
        "phase",
        "step",
        "state",
        "error",
        "failed_step",
        "moves_table",
        "was_cordoned",
        "give_back_at",
        "attempts",
        *NodeDrain.STEP_TIMESTAMPS.values(),
        "finished_at",
        "task_id",
        "created_by",
        "created_at",
    ]

    @admin.display(description="moved")
    def moved(self, obj):
        return len(obj.moves)

    @admin.display(description="moves")
    def moves_table(self, obj):
        if not obj.moves:
            return "(none yet)"
        return format_html(
            "<table>{}</table>",
            mark_safe(
                "".join(
                    format_html("<tr><td>#{}</td><td>{}</td><td>{} &rarr; {}</td></tr>", *m.values()) for m in obj.moves
                )
            ),
        )

    def save_model(self, request, obj, form, change):
        """Start it through the service (refusals were shown by the form; a race still refuses here)."""
        drain = maintenance.start(
            form.cleaned_data["node"],
            reason=form.cleaned_data["reason"],
            grace_s=form.cleaned_data["grace_s"],
            actor=request.user,
        )
        obj.pk, obj.created_at = drain.pk, drain.created_at

    def save_related(self, request, form, formsets, change):
        """Nothing to save: the service wrote the drain and its first trail row."""

    @admin.action(description="Give the node back (uncordoned once healthy)", permissions=["operate"])
    def give_back_selected(self, request, queryset):
        self._each(request, queryset, maintenance.give_back, "given back")

    @admin.action(description="Resume at the failed step", permissions=["operate"])
    def resume_selected(self, request, queryset):
        self._each(request, queryset, maintenance.resume, "resumed")
