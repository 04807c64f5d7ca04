"""Operator console for projects, requests, pools and allocations (the approval queue comes with issue 5)."""

from django.contrib import admin
from guardian.admin import GuardedModelAdmin

from .models import Allocation, ApiToken, GpuPool, PoolRequest, PoolRequestTransition, Project


@admin.register(Project)
class ProjectAdmin(GuardedModelAdmin):
    list_display = ["name", "slug", "namespace", "cost_centre", "created_at"]
    search_fields = ["name", "slug", "namespace", "cost_centre"]
    prepopulated_fields = {"slug": ["name"]}


class TransitionInline(admin.TabularInline):
    model = PoolRequestTransition
    fields = ["at", "from_state", "to_state", "actor", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(PoolRequest)
class PoolRequestAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "spec_label", "count", "isolation", "tier", "state", "start_at", "end_at"]
    list_filter = ["state", "isolation", "tier", "workload_type"]
    list_select_related = ["project"]
    search_fields = ["project__name", "project__slug", "justification"]
    readonly_fields = ["state", "state_reason", "approved_at", "approved_by", "created_at", "updated_at"]
    inlines = [TransitionInline]


@admin.register(GpuPool)
class GpuPoolAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "cluster", "workload_type", "tier", "state", "created_at"]
    list_filter = ["state", "tier", "workload_type", "cluster"]
    list_select_related = ["project", "cluster"]
    search_fields = ["name", "project__name"]
    readonly_fields = ["state", "state_reason"]


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["id", "pool", "kind", "product", "profile_name", "gpu", "replica", "allocated_at", "released_at"]
    list_filter = ["kind", "product", "profile_name", ("released_at", admin.EmptyFieldListFilter)]
    list_select_related = ["pool__project", "gpu__node__cluster"]
    search_fields = ["pool__name", "project__name", "gpu__uuid", "mig_instance__uuid"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "key_prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "key_prefix"]
    readonly_fields = ["key_prefix", "key_digest", "created_at", "last_used_at"]

    def has_add_permission(self, request):
        return False
