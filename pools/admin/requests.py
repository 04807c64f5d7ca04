"""The approval queue: pool requests with their transitions; approve, reject, withdraw and release call the
workflow services (pools/services/)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from core.admin_paging import FleetScaleAdminMixin
from core.admin_permissions import ReadOnlyInline
from tenancy import roles

from .. import services
from ..choices import RequestState
from ..models import (
    HOLDING_STATES,
    PENDING_FIRST,
    PoolRequest,
    PoolRequestTransition,
)
from .actions import run_with_reason


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
            run=lambda obj, reason: self.approve(obj, actor=request.user, reason=reason),
        )

    def approve(self, obj: PoolRequest, *, actor, reason: str):
        """An operator's approval of one request (scheduling.admin's subclass queues it instead when capacity is
        short and the request chose to wait)."""
        return services.approve(obj, actor=actor, reason=reason)

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
