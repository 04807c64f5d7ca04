"""Loans, evictions and best-effort requests: read-only audit; the lending beat and reclaim write them."""

from __future__ import annotations

from django.contrib import admin

from core.admin_paging import FleetScaleAdminMixin
from core.admin_permissions import ReadOnlyAdminMixin

from ..models import (
    BestEffortRequest,
    Eviction,
    Loan,
)


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
