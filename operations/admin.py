"""Operator console for MIG reconfigurations, and the staff pages for planning maintenance.

Reconfiguring happens on the add page: a form, then a confirmation page with the impact (pods to
evict, allocations touched, slots before and after), then the reconfiguration is created and its
first step enqueued on commit. State fields are read-only; actions call the services.
MigReconfigurationAdmin.get_urls() mounts three staff pages: capacity plan, take-offline check and
rebalancing proposal. Drains' pages: admin_drains.py, rolling upgrades': admin_upgrades.py. (Layouts,
maintenance windows, time-slicing and the MIG pictures on the GPU and node pages are capacity's.)
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext

from capacity.adapters import kubernetes as kube
from capacity.admin.layouts import TIME_SLICING_WARNING
from capacity.choices import ReconfigurationBackend
from capacity.mig.catalog import PRODUCTS
from capacity.mig.layout import parse_layout
from capacity.mig_picture import gpu_layout_html, legend_html
from capacity.models import (
    FORCE_PERMISSION,
    Cluster,
    GpuCapacity,
    MigLayout,
    MigReconfiguration,
    MigReconfigurationStep,
    NodeCapacity,
)
from capacity.services import mig_configs, planning
from core.admin_permissions import OperatorActionsMixin
from tenancy.roles import require_operator_perms

from . import admin_drains, admin_upgrades, maintenance, rebalancing  # noqa: F401 (admin_*: registering)
from . import reconfiguration as rc
from .admin_actions import TrailInline, WorkflowActionsMixin

# --- Reconfigurations ----------------------------------------------------------------------------


def _named_choices():
    names = sorted(mig_configs.named_config_entries())
    return [("", "---------")] + [(n, n) for n in names]


def parse_per_gpu(text: str) -> dict:
    """ "0: 4g.40gb,3g.40gb" lines (or "1: off") or a JSON object -> {"0": [...], "1": None}."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValidationError("give a JSON object of GPU index -> profiles")
        return {str(k): v for k, v in value.items()}
    out = {}
    for line in text.replace(";", "\n").splitlines():
        if not line.strip():
            continue
        key, sep, layout = line.partition(":")
        if not sep or not key.strip().isdigit():
            raise ValidationError(f"{line!r}: write 'GPU index: profiles', e.g. '0: 3g.40gb,3g.40gb' or '1: off'")
        if layout.strip().lower() in ("off", "disabled", "none"):
            out[key.strip()] = None
        else:
            try:
                out[key.strip()] = parse_layout(layout)
            except ValueError as exc:
                raise ValidationError(str(exc)) from None
    return out


class ReconfigureForm(forms.Form):
    node = forms.ModelChoiceField(NodeCapacity.objects.present().select_related("cluster"))
    layout = forms.ModelChoiceField(MigLayout.objects.all(), required=False, help_text="A custom layout, or")
    named = forms.ChoiceField(label="Named config", required=False, help_text="a GPU Operator named config, or")
    per_gpu = forms.CharField(
        label="Per-GPU profiles",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="one line per GPU: '0: 4g.40gb,3g.40gb', '1: 1g.10gb=7', '2: off'. GPUs not named stay as they are.",
    )
    backend = forms.ChoiceField(choices=ReconfigurationBackend.choices, initial=ReconfigurationBackend.OPERATOR)
    drain = forms.BooleanField(required=False, help_text="Evict the GPU pods (allocated GPUs may then be touched).")
    force = forms.BooleanField(required=False, help_text="Run outside the node's maintenance windows.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["named"].choices = _named_choices()

    def clean_per_gpu(self):
        return parse_per_gpu(self.cleaned_data.get("per_gpu") or "")

    def clean(self):
        data = super().clean()
        node = data.get("node")
        if node is None:
            return data
        try:
            data["source"], data["target"] = rc.target_from(
                node, layout=data.get("layout"), named=data.get("named") or "", per_gpu=data.get("per_gpu") or None
            )
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        return data


class StepInline(TrailInline):
    model = MigReconfigurationStep


@admin.register(MigReconfiguration)
class MigReconfigurationAdmin(WorkflowActionsMixin, OperatorActionsMixin, admin.ModelAdmin):
    action_nouns = ("reconfiguration", "reconfigurations")
    action_related = ("cluster", "node")
    list_display = ["id", "node", "source", "backend", "step", "state", "drain", "force", "created_by", "created_at"]
    list_filter = ["state", "step", "backend", "cluster"]
    list_select_related = ["node__cluster", "created_by"]
    search_fields = ["node__name", "source", "error", "config_name"]
    inlines = [StepInline]
    actions = ["resume_selected", "rollback_selected", "cancel_selected"]
    change_list_template = "admin/capacity/migreconfiguration/change_list.html"
    readonly_fields = [
        "cluster",
        "node",
        "layout",
        "source",
        "backend",
        "drain",
        "force",
        "step",
        "state",
        "error",
        "failed_step",
        "config_name",
        "config_written_at",
        "plan_pictures",
        "target",
        "previous",
        "was_cordoned",
        "attempts",
        *MigReconfiguration.STEP_TIMESTAMPS.values(),
        "finished_at",
        "task_id",
        "rollback_of",
        "created_by",
        "created_at",
    ]
    fields = readonly_fields

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="plan")
    def plan_pictures(self, obj):
        gpus = (obj.plan or {}).get("gpus") or {}
        product = (obj.plan or {}).get("product", "")
        if not gpus:
            return "(not planned yet)"
        rows = []
        for key, gpu in sorted(gpus.items(), key=lambda kv: int(kv[0])):
            before = gpu_layout_html(product, gpu["before"], mig=gpu["before_mig"], title=f"GPU {key} before")
            after = gpu_layout_html(
                product,
                [dict(p, state="planned") for p in gpu["placements"]],
                mig=gpu["mig"],
                title=f"GPU {key} after" + ("" if gpu["changed"] else " (unchanged)"),
            )
            rows.append(format_html('<div style="display:flex;gap:24px">{}{}</div>', before, after))
        return format_html("{}{}", legend_html(), mark_safe("".join(rows)))

    # --- actions ----------------------------------------------------------------------------

    @admin.action(description="Resume at the failed step", permissions=["operate"])
    def resume_selected(self, request, queryset):
        self._each(request, queryset, rc.resume, "resumed")

    @admin.action(description="Roll back to the layout before", permissions=["operate"])
    def rollback_selected(self, request, queryset):
        self._each(request, queryset, rc.rollback, "rolled back")

    @admin.action(description="Cancel (only before the node was cordoned)", permissions=["operate"])
    def cancel_selected(self, request, queryset):
        self._each(request, queryset, rc.cancel, "cancelled")

    # --- reconfigure: form -> confirmation -> create ---------------------------------------------

    def add_view(self, request, form_url="", extra_context=None):
        if not self.has_add_permission(request):
            raise PermissionDenied
        initial = {"node": request.GET.get("node")} if request.GET.get("node") else {}
        form = ReconfigureForm(request.POST or None, initial=initial)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Reconfigure MIG",
            "form": form,
            "impact": None,
        }
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            node = data["node"]
            if "confirm" in request.POST:
                if data["force"]:
                    require_operator_perms(request.user, FORCE_PERMISSION)
                try:
                    reconf = rc.create_from(data, actor=request.user)
                except (rc.ReconfigurationError, rc.IllegalTransition) as exc:
                    form.add_error(None, str(exc))
                else:
                    self.message_user(request, f"Reconfiguration #{reconf.pk} of {node} queued.")
                    return HttpResponseRedirect(reverse("admin:capacity_migreconfiguration_change", args=[reconf.pk]))
            else:
                try:
                    context["impact"] = self._impact(node, data)
                except rc.ReconfigurationError as exc:
                    form.add_error(None, str(exc))
        return TemplateResponse(request, "admin/capacity/migreconfiguration/reconfigure.html", context)

    def _impact(self, node, data) -> dict:
        impact = rc.assess(node, data["target"], backend=data["backend"], drain=data["drain"], force=data["force"])
        pods, pods_error = [], ""
        try:
            with mig_configs.client_for(node.cluster) as client:
                pods = rc.gpu_pods(client, node, backend=data["backend"], affected=impact.affected)
        except kube.KubernetesError as exc:
            pods_error = str(exc)
        product = next((p.product for p in impact.plans.values()), "")
        pictures = []
        for index, plan in impact.plans.items():
            before = gpu_layout_html(product, plan.before, mig=plan.before_mig, title=f"GPU {index} now")
            after = gpu_layout_html(
                product,
                [dict(p, state="planned") for p in plan.after],
                mig=plan.after_mig,
                title=f"GPU {index} after" + ("" if plan.changed else " (unchanged)"),
            )
            pictures.append(format_html('<div style="display:flex;gap:24px">{}{}</div>', before, after))
        specs = sorted(set(impact.slots_before) | set(impact.slots_after))
        return {
            "changed": impact.changed,
            "affected": impact.affected,
            "allocations": impact.allocations,
            "refusals": impact.refusals,
            "window_open": impact.window_open,
            "next_window": impact.next_window,
            "pods": [f"{p.namespace}/{p.name}" for p in pods],
            "pods_error": pods_error,
            "evict": data["drain"],
            "slots": [(s, impact.slots_before.get(s, 0), impact.slots_after.get(s, 0)) for s in specs],
            "pictures": format_html("{}{}", legend_html(), mark_safe("".join(pictures))),
        }

    # --- staff pages -----------------------------------------------------------------------------

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("capacity-plan/", view(self.capacity_plan_view), name="capacity_capacity_plan"),
            path("take-offline/", view(self.take_offline_view), name="capacity_take_offline"),
            path("rebalance/", view(self.rebalance_view), name="capacity_rebalance"),
            *super().get_urls(),
        ]

    def _page(self, request, template, title, **context):
        return TemplateResponse(
            request,
            template,
            {**self.admin_site.each_context(request), "opts": self.model._meta, "title": title, **context},
        )

    def capacity_plan_view(self, request):
        require_operator_perms(request.user, "capacity.view_nodecapacity")
        form = CapacityPlanForm(request.GET or None)
        current = proposed = live = None
        error = ""
        if form.is_valid():
            data = form.cleaned_data
            current = planning.current_capacity_plan(
                cluster=data.get("cluster"), node_group=data.get("node_group") or None
            )
            live = planning.tier_plan(cluster=data.get("cluster"))
            if data.get("product") and data.get("gpus"):
                try:
                    proposed = planning.proposed_capacity_plan(
                        data["product"],
                        data["gpus"],
                        layout=data.get("layout") or None,
                        timeslice_replicas=data.get("replicas"),
                    )
                except ValueError as exc:
                    error = str(exc)
        elif not request.GET:
            current = planning.current_capacity_plan()
            live = planning.tier_plan()
        return self._page(
            request,
            "admin/capacity/migreconfiguration/capacity_plan.html",
            "Capacity plan: units per tier",
            form=form,
            live=live,
            current=current,
            proposed=proposed,
            error=error,
            warning=TIME_SLICING_WARNING,
        )

    def take_offline_view(self, request):
        require_operator_perms(request.user, "capacity.view_nodecapacity", "capacity.view_allocation")
        form = TakeOfflineForm(request.POST or None)
        check = None
        if request.method == "POST" and form.is_valid():
            check = maintenance.take_offline_check(gpus=form.cleaned_data["gpus"], nodes=form.cleaned_data["nodes"])
        return self._page(
            request,
            "admin/capacity/migreconfiguration/take_offline.html",
            "Take offline: would the remaining capacity cover every allocation?",
            form=form,
            check=check,
        )

    def rebalance_view(self, request):
        require_operator_perms(request.user, "capacity.view_migreconfiguration")
        form = RebalanceForm(request.POST or request.GET or None)
        proposal = None
        created, refused = [], {}
        if form.is_valid():
            data = form.cleaned_data
            proposal = rebalancing.propose_rebalance(data["cluster"], data["product"], days=data["days"])
            if request.method == "POST" and "create" in request.POST:
                # Queuing reconfigurations is an add; forcing them outside the window needs its own permission.
                require_operator_perms(
                    request.user, "capacity.add_migreconfiguration", *([FORCE_PERMISSION] if data["force"] else [])
                )
                with transaction.atomic():
                    created, refused = rebalancing.create_rebalance_reconfigurations(
                        proposal, backend=data["backend"], drain=data["drain"], force=data["force"], actor=request.user
                    )
                self.message_user(
                    request,
                    ngettext("%d reconfiguration queued.", "%d reconfigurations queued.", len(created)) % len(created),
                )
                for name, reason in refused.items():
                    self.message_user(request, f"{name}: {reason}", messages.WARNING)
        return self._page(
            request,
            "admin/capacity/migreconfiguration/rebalance.html",
            "Rebalancing proposal for the next maintenance window",
            form=form,
            proposal=proposal.to_dict() if proposal else None,
            created=created,
        )


class CapacityPlanForm(forms.Form):
    cluster = forms.ModelChoiceField(Cluster.objects.all(), required=False)
    node_group = forms.CharField(required=False)
    product = forms.ChoiceField(choices=[("", "---------")] + [(k, k) for k in PRODUCTS], required=False)
    gpus = forms.IntegerField(min_value=0, required=False, label="GPUs (proposal)")
    layout = forms.CharField(required=False, help_text="Per-GPU MIG layout, e.g. 4g.40gb,3g.40gb")
    replicas = forms.IntegerField(min_value=2, required=False, label="Time-slice replicas")


class TakeOfflineForm(forms.Form):
    nodes = forms.ModelMultipleChoiceField(NodeCapacity.objects.present().select_related("cluster"), required=False)
    gpus = forms.ModelMultipleChoiceField(GpuCapacity.objects.present().select_related("node"), required=False)

    def clean(self):
        data = super().clean()
        if not data.get("nodes") and not data.get("gpus"):
            raise ValidationError("Choose nodes or GPUs.")
        return data


class RebalanceForm(forms.Form):
    cluster = forms.ModelChoiceField(Cluster.objects.all())
    product = forms.ChoiceField(choices=[(k, k) for k in PRODUCTS])
    days = forms.IntegerField(min_value=1, max_value=365, initial=30)
    backend = forms.ChoiceField(
        choices=ReconfigurationBackend.choices, initial=ReconfigurationBackend.AGENT, required=False
    )
    drain = forms.BooleanField(required=False)
    force = forms.BooleanField(required=False, help_text="Create them now, outside the maintenance window.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Default to what the fleet is made of, not the catalog's first entry.
        fleet = GpuCapacity.objects.present().most_common_product()
        if fleet in PRODUCTS:
            self.fields["product"].initial = fleet

    def clean_backend(self):
        return self.cleaned_data.get("backend") or ReconfigurationBackend.AGENT
