"""Operator console for the queue: the waiting requests in order, auto-approval policies, project weights, and
the pool requests' admin with the queue's approval (pools.admin's PoolRequestAdmin, re-registered here).

Queue entries are read-only; hold, release hold, move to the top and cancel are actions that call
scheduling/queue.py (each writes a QueueEvent). The changelist's title carries the forecast's accuracy
(scheduling/forecast accuracy()): predicted against actual start of every request that started.
"""

from __future__ import annotations

from django.contrib import admin
from django.template.response import TemplateResponse
from django.urls import path

from capacity.mig.catalog import PRODUCTS
from core.admin_permissions import ReadOnlyInline
from pools.admin import PoolRequestAdmin as PoolsPoolRequestAdmin
from pools.admin import run_with_reason
from pools.choices import RequestState
from pools.models import PoolRequest
from pools.models.queue import AutoApprovalPolicy, ProjectQueueWeight, QueueEntry, QueueEvent
from tenancy import roles

from . import forecast, procurement, queue
from .api.procurement import WhatIfQuery
from .policy import queue_policy


@admin.register(AutoApprovalPolicy)
class AutoApprovalPolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", *AutoApprovalPolicy.RULE_FIELDS]
    list_filter = ["enabled", "tier", "spec_kind"]
    filter_horizontal = ["projects"]
    search_fields = ["name", "project_group", "profile_name"]


@admin.register(ProjectQueueWeight)
class ProjectQueueWeightAdmin(admin.ModelAdmin):
    list_display = ["project", "weight"]
    list_select_related = ["project"]
    search_fields = ["project__slug", "project__name"]


class ApprovableFilter(admin.SimpleListFilter):
    title = "can be approved now"
    parameter_name = "approvable"

    def lookups(self, request, model_admin):
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(approvable_at__isnull=False, on_hold=False, request__state=RequestState.QUEUED)
        if self.value() == "no":
            return queryset.exclude(approvable_at__isnull=False, on_hold=False, request__state=RequestState.QUEUED)
        return queryset


class OnLoanFilter(admin.SimpleListFilter):
    title = "running on lent units"
    parameter_name = "on_loan"

    def lookups(self, request, model_admin):
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(running_on_loan_since__isnull=False)
        if self.value() == "no":
            return queryset.filter(running_on_loan_since__isnull=True)
        return queryset


class QueueEventInline(ReadOnlyInline):
    model = QueueEvent
    fk_name = "request"
    fields = ["action", "actor", "policy", "detail", "at"]


@admin.register(QueueEntry)
class QueueEntryAdmin(admin.ModelAdmin):
    """The queue in its order (waiting first); the title says how good the forecast has been."""

    list_display = [
        "request",
        "project",
        "priority",
        "position",
        "ordered_by",
        "on_hold",
        "approvable_at",
        "running_on_loan_since",
        "queued_at",
        "forecast_p50",
        "forecast_p90",
        "first_p50",
        "started",
    ]
    list_filter = [ApprovableFilter, OnLoanFilter, "on_hold"]
    list_select_related = ["request__project"]
    actions = ["hold_selected", "unhold_selected", "move_to_top", "cancel_selected"]

    def has_add_permission(self, request):
        return False

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in QueueEntry._meta.fields]

    def has_approve_permission(self, request) -> bool:
        return roles.operator_can(request.user, "pools.approve_poolrequest")

    def get_urls(self):
        view = self.admin_site.admin_view
        return [path("what-if/", view(self.what_if_view), name="pools_procurement_what_if"), *super().get_urls()]

    def what_if_view(self, request):
        """The procurement what-if (scheduling/procurement.py), its input read as the API reads it (WhatIfQuery)."""
        roles.require_operator_perms(request.user, "pools.view_poolrequest")
        query = WhatIfQuery(data=request.GET) if request.GET else None
        answer = query.answer() if query is not None and query.is_valid() else None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Procurement what-if: waits with more GPUs",
            "errors": query.errors if query is not None and answer is None else {},
            "answer": answer,
            "asked": request.GET,
            "products": sorted(PRODUCTS),
            "tiers": {tier.value: tier.label for tier in procurement.TIER_KINDS},
        }
        return TemplateResponse(request, "admin/pools/procurement_what_if.html", context)

    def changelist_view(self, request, extra_context=None):
        self._places = {p.entry.pk: p for p in queue_policy.ordered()}
        score = forecast.accuracy()
        title = "Queue"
        if score["started"]:
            title += (
                f" — forecast accuracy over {score['started']} started: P50 error {score['mae_h']} h"
                f" on a mean wait of {score['mean_wait_h']} h (ratio {score['mae_ratio']}),"
                f" {score['within_p90']:.0%} started by their P90"
            )
            if score["ran_on_loan_first"]:
                title += (
                    f"; {score['ran_on_loan_first']} ran on lent units first,"
                    f" after a mean wait of {score['mean_wait_to_loan_h']} h"
                )
            if score["without_forecast"]:
                title += f"; {score['without_forecast']} started that had no forecast start within the horizon"
        return super().changelist_view(request, extra_context={"title": title, **(extra_context or {})})

    @admin.display(description="Project")
    def project(self, obj):
        return obj.request.project

    @admin.display(description="Priority")
    def priority(self, obj):
        return obj.request.effective_priority

    @admin.display(description="Place")
    def position(self, obj):
        place = getattr(self, "_places", {}).get(obj.pk)
        return place.position if place else "-"

    @admin.display(description="Ordered by")
    def ordered_by(self, obj):
        """Fair share (GPU-hours over weight) for a request's first QUEUE_AGED_AFTER_H hours, then age."""
        place = getattr(self, "_places", {}).get(obj.pk)
        if place is None:
            return "-"
        if obj.manual_rank is not None:
            return "operator's move"
        return "age" if place.aged else f"fair share {place.fair_share:.1f}"

    @admin.display(description="Started")
    def started(self, obj):
        return obj.request.approved_at or "-"

    def _run(self, request, queryset, verb, run, reason_required=False):
        return run_with_reason(
            self,
            request,
            queryset.select_related("request"),
            verb=verb,
            title=f"Queue: {verb}",
            reason_required=reason_required,
            run=lambda entry, reason: run(entry.request, reason),
        )

    @admin.action(description="Hold selected…", permissions=["approve"])
    def hold_selected(self, request, queryset):
        return self._run(request, queryset, "held", lambda r, why: queue.hold(r, actor=request.user, reason=why))

    @admin.action(description="Release hold of selected…", permissions=["approve"])
    def unhold_selected(self, request, queryset):
        return self._run(
            request, queryset, "released from hold", lambda r, why: queue.unhold(r, actor=request.user, reason=why)
        )

    @admin.action(description="Move selected to the top…", permissions=["approve"])
    def move_to_top(self, request, queryset):
        return self._run(
            request,
            queryset,
            "moved to the top",
            lambda r, why: queue.move(r, position=1, actor=request.user, reason=why),
        )

    @admin.action(description="Cancel selected…", permissions=["approve"])
    def cancel_selected(self, request, queryset):
        return self._run(
            request,
            queryset,
            "cancelled",
            lambda r, why: queue.cancel(r, actor=request.user, reason=why),
            reason_required=True,
        )


class PoolRequestAdmin(PoolsPoolRequestAdmin):
    def approve(self, obj: PoolRequest, *, actor, reason: str):
        """Approve, or queue instead when capacity is short and the request chose to wait (queue.approve_or_queue)."""
        return queue.approve_or_queue(obj, actor=actor, reason=reason)


admin.site.unregister(PoolRequest)
admin.site.register(PoolRequest, PoolRequestAdmin)
