"""Operator console: the approval queue, pools and their provisioning, allocations, project members.

State fields are read-only here; actions call the workflow services (pools/services/) and end
with a "N requests approved" message. Approve, reject and release ask for a reason on an
intermediate page first.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from capacity.models import Cluster
from core.admin_paging import FleetScaleAdminMixin
from core.admin_permissions import ReadOnlyAdminMixin, ReadOnlyInline
from tenancy import roles

from . import lending, queue, services
from .choices import PoolState, RequestState, SharePriority
from .exceptions import DomainError
from .models import (
    HOLDING_STATES,
    PENDING_FIRST,
    Allocation,
    BestEffortRequest,
    Eviction,
    GpuPool,
    Loan,
    PoolCluster,
    PoolRequest,
    PoolRequestTransition,
    gpu_count,
)


class ReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), required=False, max_length=2000)

    def __init__(self, *args, reason_required: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reason"].required = reason_required


def run_with_reason(model_admin, request, queryset, *, verb: str, title: str, run, reason_required=False):
    """An admin action in two steps: a page asking for the reason, then `run(obj, reason)` on each object.

    Objects are handled one by one in primary-key order, each in its own transaction (the services'),
    so one refusal does not undo the others; refusals are listed in a warning.
    """
    if "apply" in request.POST:
        form = ReasonForm(request.POST, reason_required=reason_required)
        if form.is_valid():
            done, refused = 0, []
            for obj in queryset.order_by("pk"):
                try:
                    run(obj, form.cleaned_data["reason"])
                    done += 1
                except DomainError as exc:
                    refused.append(f"#{obj.pk}: {exc.message}")
            noun = model_admin.model._meta.verbose_name if done == 1 else model_admin.model._meta.verbose_name_plural
            model_admin.message_user(request, f"{done} {noun} {verb}.", messages.SUCCESS)
            if refused:
                model_admin.message_user(request, "Refused: " + " | ".join(refused), messages.WARNING)
            return None
    else:
        form = ReasonForm(reason_required=reason_required)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "objects": queryset.order_by("pk"),
        "form": form,
        "action": request.POST.get("action", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "verb": verb,
    }
    return TemplateResponse(request, "admin/pools/reason_form.html", context)


# --- The approval queue --------------------------------------------------------------------------


class TransitionInline(ReadOnlyInline):
    model = PoolRequestTransition
    fields = ["at", "from_state", "to_state", "actor", "reason"]


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [
            ("pending", "Awaiting approval"),
            ("queued", "Queued for capacity"),
            ("approvable", "Queued: can be approved now"),
            ("holding", "Holding units"),
            ("closed", "Closed"),
        ]

    def queryset(self, request, queryset):
        if self.value() == "queued":
            return queryset.filter(state=RequestState.QUEUED)
        if self.value() == "approvable":
            return queryset.filter(
                state=RequestState.QUEUED, queue_entry__approvable_at__isnull=False, queue_entry__on_hold=False
            )
        if self.value() == "pending":
            return queryset.filter(state=RequestState.SUBMITTED)
        if self.value() == "holding":
            return queryset.filter(state__in=HOLDING_STATES)
        if self.value() == "closed":
            return queryset.exclude(
                state__in=[RequestState.SUBMITTED, RequestState.QUEUED, RequestState.DRAFT, *HOLDING_STATES]
            )
        return queryset


class PoolClusterFilter(admin.SimpleListFilter):
    """Pools with units on a cluster: a pool across clusters is listed under each of them, as in the API."""

    title = "cluster"
    parameter_name = "cluster"

    def lookups(self, request, model_admin):
        return list(Cluster.objects.order_by("name").values_list("pk", "name"))

    def queryset(self, request, queryset):
        if self.value():
            return queryset.on_cluster(self.value())
        return queryset


@admin.register(PoolRequest)
class PoolRequestAdmin(FleetScaleAdminMixin, admin.ModelAdmin):
    """The approval queue: submitted requests first, then the rest, newest first."""

    list_display = [
        "id",
        "project",
        "spec_label",
        "count",
        "isolation",
        "tier",
        "state",
        "requested_by",
        "start_at",
        "end_at",
        "pool_link",
        "queue_column",
        "created_at",
    ]
    list_filter = [QueueFilter, "state", "isolation", "tier", "workload_type", "product"]
    list_select_related = ["project", "requested_by", "pool", "queue_entry"]
    search_fields = ["=id", "project__name", "project__slug", "justification", "name"]
    readonly_fields = [
        "state",
        "state_reason",
        "approved_at",
        "approved_by",
        "expiry_notice_at",
        "created_at",
        "updated_at",
    ]
    inlines = [TransitionInline]
    actions = ["approve_selected", "reject_selected", "release_selected"]

    def get_ordering(self, request):
        return list(PENDING_FIRST)

    def has_add_permission(self, request):
        return False  # requests come from projects, through the API (the spec is resolved there)

    def get_readonly_fields(self, request, obj=None):
        # Every field: a request is the project's, its workflow goes through the actions (which call
        # the services and write a PoolRequestTransition with who, when and why). No silent edits.
        return [f.name for f in PoolRequest._meta.fields]

    def has_approve_permission(self, request) -> bool:
        return roles.operator_can(request.user, "pools.approve_poolrequest")

    @admin.display(description="Pool")
    def pool_link(self, obj):
        pool = getattr(obj, "pool", None)
        if pool is None:
            return "-"
        return format_html('<a href="{}">{}</a>', reverse("admin:pools_gpupool_change", args=[pool.pk]), pool.name)

    @admin.display(description="Queue")
    def queue_column(self, obj):
        entry = getattr(obj, "queue_entry", None)
        if entry is None or obj.state != RequestState.QUEUED:
            return "-"
        if entry.on_hold:
            return "on hold"
        if entry.approvable_at is not None:
            return "can be approved now"
        return f"P50 {entry.forecast_p50:%Y-%m-%d %H:%M}" if entry.forecast_p50 else "waiting"

    @admin.action(description="Approve selected requests…", permissions=["approve"])
    def approve_selected(self, request, queryset):
        return run_with_reason(
            self,
            request,
            queryset,
            verb="approved",
            title="Approve pool requests",
            run=lambda obj, reason: queue.approve_or_queue(obj, actor=request.user, reason=reason),
        )

    @admin.action(description="Reject selected requests…", permissions=["approve"])
    def reject_selected(self, request, queryset):
        return run_with_reason(
            self,
            request,
            queryset,
            verb="rejected",
            title="Reject pool requests",
            reason_required=True,
            run=lambda obj, reason: services.reject(obj, actor=request.user, reason=reason),
        )

    @admin.action(description="Release selected requests' capacity…", permissions=["change"])
    def release_selected(self, request, queryset):
        return run_with_reason(
            self,
            request,
            queryset,
            verb="released",
            title="Release pool capacity",
            run=lambda obj, reason: services.release(obj, actor=request.user, reason=reason),
        )


# --- Pools and allocations -----------------------------------------------------------------------


class AllocationInline(ReadOnlyInline):
    model = Allocation
    fields = ["kind", "product", "profile_name", "gpu", "mig_instance", "replica", "allocated_at", "released_at"]
    show_change_link = True

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("gpu__node__cluster", "mig_instance__profile")


class PoolClusterInline(ReadOnlyInline):
    """The clusters a pool holds units on, with each one's units now and its provisioning there."""

    model = PoolCluster
    fields = ["cluster", "units_held", "units", "state", "provisioned_at", "deprovisioned_at", "reconciled_at", "error"]
    verbose_name_plural = "Clusters"

    def get_queryset(self, request):
        return super().get_queryset(request).with_units().select_related("cluster")

    @admin.display(description="Units held now")
    def units_held(self, obj):
        return obj.units_held

    @admin.display(description="Provisioning here")
    def state(self, obj):
        return obj.state.label


@admin.register(GpuPool)
class GpuPoolAdmin(FleetScaleAdminMixin, admin.ModelAdmin):
    list_display = [
        "name",
        "project",
        "cluster",
        "clusters",
        "workload_type",
        "tier",
        "state",
        "units",
        "gpus",
        "binding",
        "binding_note",
        "lending_enabled",
        "share_priority",
        "attempts",
        "created_at",
        "released_at",
    ]
    list_filter = ["state", "tier", "workload_type", PoolClusterFilter, "lending_enabled", "share_priority"]
    list_select_related = ["project", "cluster", "request"]
    search_fields = ["name", "project__name", "project__slug"]
    readonly_fields = [
        "state",
        "state_reason",
        "attempts",
        "task_id",
        "last_attempt_at",
        "provisioned_at",
        "released_at",
        "deprovisioned_at",
    ]
    inlines = [PoolClusterInline, AllocationInline]
    actions = [
        "retry_provisioning",
        "release_selected",
        "enable_lending",
        "disable_lending",
        "reclaim_lent",
        "share_priority_high",
        "share_priority_normal",
        "share_priority_low",
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).with_card().with_clusters().with_shares()

    def _set_share_priority(self, request, queryset, priority: str) -> None:
        """Operators choose a shared pool's priority (pools.services.set_share_priority); other pools are skipped."""
        changed, skipped = 0, []
        for pool in queryset.order_by("pk"):
            try:
                changed += services.set_share_priority(pool, priority, actor=request.user)
            except ValueError:
                skipped.append(pool.name)
        self.message_user(request, f"{changed} pools now have {priority} share priority.", messages.SUCCESS)
        if skipped:
            self.message_user(
                request, "Not time-sliced or MPS (no share priority): " + ", ".join(skipped), messages.WARNING
            )

    @admin.action(description="Share priority: high (evicted last)", permissions=["change"])
    def share_priority_high(self, request, queryset):
        self._set_share_priority(request, queryset, SharePriority.HIGH)

    @admin.action(description="Share priority: normal", permissions=["change"])
    def share_priority_normal(self, request, queryset):
        self._set_share_priority(request, queryset, SharePriority.NORMAL)

    @admin.action(description="Share priority: low (evicted first)", permissions=["change"])
    def share_priority_low(self, request, queryset):
        self._set_share_priority(request, queryset, SharePriority.LOW)

    def has_add_permission(self, request):
        return False  # pools are created by approval only

    @admin.display(description="Units per cluster")
    def clusters(self, obj):
        """Where the units are: one cluster, or each cluster of a pool across clusters."""
        return obj.units_per_cluster() or "-"

    def get_readonly_fields(self, request, obj=None):
        # Every field: a pool's state, units and provisioning change through the actions and services.
        return [f.name for f in GpuPool._meta.fields]

    @admin.display(description="Units in use / total")
    def units(self, obj):
        return f"{obj.units_in_use}/{obj.units_total}"

    @admin.display(description="GPUs in use / held (shares)")
    def gpus(self, obj):
        """Each unit as its share of a GPU (a 3g.40gb of an H100 is 0.5), as billing charges it."""
        held, in_use = obj.gpu_shares()
        return f"{gpu_count(in_use):g}/{gpu_count(held):g}"

    @admin.display(description="Binding", ordering="cluster__binding")
    def binding(self, obj):
        """DRA (exact device, docs/dra.md) or device plugin (by count): the cluster's."""
        return obj.cluster.get_binding_display()

    @admin.display(description="Dedication")
    def binding_note(self, obj):
        """The shared-node note, and the units short of the request when an instance was destroyed."""
        parts = [obj.card()["binding_note"]] if obj.shared_node else []
        if obj.shortfall:
            parts.append(f"{obj.shortfall} unit(s) short")
        return "; ".join(parts) or "-"

    @admin.action(description="Lend idle units of selected pools (opt in)", permissions=["change"])
    def enable_lending(self, request, queryset):
        changed = sum(lending.set_lending(pool, True) for pool in queryset.order_by("pk"))
        self.message_user(request, f"{changed} pools now lend their idle units.", messages.SUCCESS)

    @admin.action(description="Stop lending for selected pools (opt out; lent units come back)", permissions=["change"])
    def disable_lending(self, request, queryset):
        changed = sum(lending.set_lending(pool, False) for pool in queryset.order_by("pk"))
        self.message_user(request, f"{changed} pools no longer lend.", messages.SUCCESS)

    @admin.action(description="Take lent units of selected pools back", permissions=["change"])
    def reclaim_lent(self, request, queryset):
        started = sum(lending.reclaim_pool(pool, reason="an operator asked") for pool in queryset.order_by("pk"))
        self.message_user(request, f"{started} lent units are being taken back.", messages.SUCCESS)

    @admin.action(description="Retry provisioning of selected failed pools", permissions=["change"])
    def retry_provisioning(self, request, queryset):
        done, refused = 0, []
        for pool in queryset.filter(state__in=[PoolState.FAILED, PoolState.PROVISIONING]).order_by("pk"):
            try:
                services.retry_provisioning(pool, actor=request.user)
                done += 1
            except DomainError as exc:
                refused.append(f"{pool}: {exc.message}")
        self.message_user(request, f"{done} pools queued for provisioning.", messages.SUCCESS)
        if refused:
            self.message_user(request, "Refused: " + " | ".join(refused), messages.WARNING)

    @admin.action(description="Release selected pools…", permissions=["change"])
    def release_selected(self, request, queryset):
        requests = PoolRequest.objects.filter(pk__in=queryset.values("request_id"))
        return run_with_reason(
            self,
            request,
            requests,
            verb="released",
            title="Release pools",
            run=lambda obj, reason: services.release(obj, actor=request.user, reason=reason),
        )


@admin.register(Allocation)
class AllocationAdmin(FleetScaleAdminMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "pool",
        "project",
        "kind",
        "product",
        "profile_name",
        "cluster",
        "node",
        "gpu_uuid",
        "replica",
        "allocated_at",
        "released_at",
        "end_reason",
    ]
    list_filter = ["kind", "product", "profile_name", ("released_at", admin.EmptyFieldListFilter)]
    list_select_related = ["pool__project", "project", "gpu__node__cluster"]
    search_fields = ["pool__name", "project__name", "gpu__uuid", "mig_instance__uuid"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="Cluster", ordering="gpu__node__cluster__name")
    def cluster(self, obj):
        return obj.gpu.node.cluster.name

    @admin.display(description="Node", ordering="gpu__node__name")
    def node(self, obj):
        return obj.gpu.node.name

    @admin.display(description="GPU")
    def gpu_uuid(self, obj):
        return obj.gpu.uuid


@admin.register(Loan)
class LoanAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Lent units: read-only; loans are made by the lending beat and end through reclaim (pools/lending.py)."""

    list_display = [
        "allocation",
        "lender_pool",
        "borrower",
        "borrower_request",
        "best_effort",
        "state",
        "started_at",
        "reclaim_requested_at",
        "returned_at",
        "reason",
    ]
    list_filter = ["state"]
    list_select_related = [
        "allocation__gpu",
        "allocation__pool__project",
        "lender_pool__project",
        "borrower",
        "borrower_request__project",
        "best_effort__project",
    ]
    search_fields = ["borrower__slug", "lender_pool__name", "lender_pool__project__slug"]


@admin.register(Eviction)
class EvictionAdmin(ReadOnlyAdminMixin, FleetScaleAdminMixin, admin.ModelAdmin):
    """The audit of every eviction gpuaas made when a reservation or a loan ended: read-only (pools/ending.py)."""

    list_display = ["at", "namespace", "pod_name", "outcome", "allocation", "loan", "project", "reason"]
    list_filter = ["outcome"]
    list_select_related = ["allocation__gpu", "allocation__pool__project", "loan", "project"]
    search_fields = ["namespace", "pod_name", "project__slug"]
    date_hierarchy = "at"


@admin.register(BestEffortRequest)
class BestEffortRequestAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Best-effort requests: read-only; projects make and end them through the API, lend_idle serves them."""

    list_display = ["pk", "project", "spec_kind", "product", "profile_name", "count", "until", "state", "created_at"]
    list_filter = ["state", "spec_kind"]
    list_select_related = ["project"]
    search_fields = ["project__slug", "product", "profile_name"]


from . import queue_admin  # noqa: E402, F401  the queue's own admin pages (policies, entries, weights)
