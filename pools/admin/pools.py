"""Pools and the allocations (units) they hold, with their provisioning on each cluster."""

from __future__ import annotations

from django.contrib import admin, messages

from capacity.models import Cluster
from core.admin_paging import FleetScaleAdminMixin
from core.admin_permissions import ReadOnlyInline
from pools import lending

from .. import services
from ..choices import PoolState, SharePriority
from ..exceptions import DomainError
from ..models import (
    Allocation,
    GpuPool,
    PoolCluster,
    PoolRequest,
    gpu_count,
)
from .actions import run_with_reason


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
