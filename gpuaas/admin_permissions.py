"""Permission hooks the admin consoles share: operator actions need model permissions, not just is_staff.

Django runs an action only if the user passes every `has_<name>_permission(request)` named in the
action's `permissions=[...]`. The read-only consoles (mirrors, health events, reconfigurations)
return False from has_change_permission so that no form edits their rows; their actions name
"operate" instead, which asks for the model's change permission through tenancy.roles.operator_can.
"""

from __future__ import annotations

from tenancy.roles import operator_can


class OperatorActionsMixin:
    """`@admin.action(permissions=["operate"])`: the user must hold `<app>.change_<model>` (or be superuser)."""

    def has_operate_permission(self, request) -> bool:
        opts = self.opts
        return operator_can(request.user, f"{opts.app_label}.change_{opts.model_name}")
