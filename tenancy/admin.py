"""Operator console for tenancy: projects and their members (one role each), personal API tokens, and
failed sign-ins (django-axes' Access attempts, with an Unlock action)."""

from __future__ import annotations

from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt
from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from guardian.admin import GuardedModelAdmin

from core.admin_paging import FleetScaleAdminMixin

from . import roles, services
from .choices import Role
from .models import ApiToken, ExternalIdentity, IdentityGroupRole, Project


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=[*Role.choices, ("", "Remove from project")], required=False)

    def clean_username(self):
        user = get_user_model().objects.filter(username=self.cleaned_data["username"]).first()
        if user is None:
            raise forms.ValidationError("No such user.")
        self.cleaned_data["user"] = user
        return user.username


@admin.register(Project)
class ProjectAdmin(FleetScaleAdminMixin, GuardedModelAdmin):
    list_display = ["name", "slug", "namespace", "cost_centre", "pools_held", "members_link", "created_at"]
    search_fields = ["name", "slug", "namespace", "cost_centre"]
    prepopulated_fields = {"slug": ["name"]}

    def get_queryset(self, request):
        # A Subquery, not JOIN + COUNT: the changelist stays one row per project however many pools.
        # Pools are read through Project's reverse relation (`pools`, the pools app's GpuPool): tenancy
        # is the bottom layer and imports no app. Held = not released, as GpuPool.objects.held().
        held = (
            Project.objects.filter(pk=OuterRef("pk"), pools__released_at__isnull=True)
            .order_by()
            .values("pk")
            .annotate(n=Count("pools"))
            .values("n")
        )
        return super().get_queryset(request).annotate(held_pools=Coalesce(Subquery(held), 0))

    @admin.display(description="Pools held", ordering="held_pools")
    def pools_held(self, obj):
        return obj.held_pools

    @admin.display(description="Members")
    def members_link(self, obj):
        return format_html('<a href="{}">members</a>', reverse("admin:tenancy_project_members", args=[obj.pk]))

    def get_urls(self):
        extra = [
            path(
                "<path:object_id>/members/",
                self.admin_site.admin_view(self.members_view),
                name="tenancy_project_members",
            )
        ]
        return extra + super().get_urls()

    def members_view(self, request, object_id):
        """List members with their roles; add, change or remove one (set_role), then back here."""
        project = get_object_or_404(Project, pk=object_id)
        if not self.has_change_permission(request, project):
            raise PermissionDenied
        form = MemberForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            user, role = form.cleaned_data["user"], form.cleaned_data["role"] or None
            roles.set_role(project, user, role)
            self.message_user(request, f"{user.username}: {role or 'removed'} on {project.slug}.", messages.SUCCESS)
            return redirect("admin:tenancy_project_members", object_id=project.pk)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Members of {project}",
            "opts": self.model._meta,
            "original": project,
            "members": roles.members(project),
            "form": form,
            "roles": Role.choices,
        }
        return TemplateResponse(request, "admin/tenancy/project/members.html", context)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "key_prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "key_prefix"]
    # The owner and the expiry are read-only (a token moved to another user, or given a longer life,
    # would grant what nobody asked for); only the name can be edited, and tokens can be revoked.
    readonly_fields = [
        "user",
        "key_prefix",
        "key_digest",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
        "parent",
    ]
    actions = ["revoke_selected"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected tokens (and the tokens created with them)", permissions=["change"])
    def revoke_selected(self, request, queryset):
        done = sum(services.revoke_token(token) for token in queryset.filter(revoked_at__isnull=True))
        self.message_user(request, f"{done} tokens revoked.", messages.SUCCESS)


admin.site.unregister(AccessAttempt)


@admin.register(AccessAttempt)
class LockoutAdmin(AccessAttemptAdmin):
    """Axes' Access attempts, plus the operator's unlock: a username is locked across addresses, so
    deleting one row rarely frees it; the action clears every row of the selected usernames."""

    actions = ["unlock_sign_in"]

    @admin.action(description="Unlock sign-in for the selected usernames (from every address)", permissions=["delete"])
    def unlock_sign_in(self, request, queryset):
        usernames = sorted({name for name in queryset.values_list("username", flat=True) if name})
        cleared = services.unlock_sign_in(usernames)
        self.message_user(
            request, f"Unlocked sign-in for {', '.join(usernames)} ({cleared} attempts cleared).", messages.SUCCESS
        )


@admin.register(IdentityGroupRole)
class IdentityGroupRoleAdmin(admin.ModelAdmin):
    """Which identity-provider group gives what: applied at each sign-in (docs/security.md "Company sign-in")."""

    list_display = ["group", "operator", "project", "role", "created_at"]
    list_filter = ["operator", "role"]
    list_select_related = ["project"]
    search_fields = ["group", "project__slug", "project__name"]
    autocomplete_fields = ["project"]


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(admin.ModelAdmin):
    """Who signed in through the provider, with the groups it last gave; read-only (the provider decides)."""

    list_display = ["user", "subject", "issuer", "groups", "last_seen_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "subject"]
    readonly_fields = ["user", "issuer", "subject", "groups", "last_seen_at"]

    def has_add_permission(self, request):
        return False
