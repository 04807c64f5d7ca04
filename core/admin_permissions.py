"""Permission hooks the admin consoles share: operator actions need model permissions, not just is_staff.

Django runs an action only if the user passes every `has_<name>_permission(request)` named in the
action's `permissions=[...]`. The read-only consoles (mirrors, health events, reconfigurations)
return False from has_change_permission so that no form edits their rows; their actions name
"operate" instead, which asks for the model's change permission through tenancy.roles.operator_can.
"""

from __future__ import annotations

from django.contrib import admin

from tenancy.roles import operator_can


class OperatorActionsMixin:
    """`@admin.action(permissions=["operate"])`: the user must hold `<app>.change_<model>` (or be superuser)."""

    def has_operate_permission(self, request) -> bool:
        opts = self.opts
        return operator_can(request.user, f"{opts.app_label}.change_{opts.model_name}")


class ReadOnlyAdminMixin:
    """A console (or inline) that shows rows and never edits them: no add, change or delete form.

    For audit trails and mirrors of cluster state, which change only through services and actions.
    `obj=None` on add keeps the one signature valid for ModelAdmin and InlineModelAdmin alike.
    """

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    """An inline audit or mirror under its parent: every listed field shown, none added, edited or deleted."""

    extra = 0
    can_delete = False

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False
