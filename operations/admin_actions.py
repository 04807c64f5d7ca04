"""The admin's bulk actions on workflows (reconfigurations, drains, rolling upgrades): one service call per
selected row, a count of what it did and a warning for each row whose state refused it; and the pages of a
workflow started from its add page (drains, rolling upgrades)."""

from __future__ import annotations

from django.contrib import messages
from django.utils.translation import ngettext

from core.admin_permissions import ReadOnlyInline

from .reconfiguration.outcomes import IllegalTransition


class WorkflowActionsMixin:
    """`_each(request, queryset, service, verb)` for a ModelAdmin whose actions call a workflow service."""

    action_nouns = ("row", "rows")  # singular, plural: "3 drains resumed."
    action_related: tuple[str, ...] = ()  # select_related for the service (cluster, node)

    def _each(self, request, queryset, service, verb: str) -> None:
        done, errors = 0, []
        for row in queryset.select_related(*self.action_related) if self.action_related else queryset:
            try:
                service(row, actor=request.user)
                done += 1
            except IllegalTransition as exc:
                errors.append(str(exc))
        one, many = self.action_nouns
        self.message_user(request, ngettext(f"%d {one} {verb}.", f"%d {many} {verb}.", done) % done)
        for error in errors:
            self.message_user(request, error, messages.WARNING)


class StartedOnAddPageMixin:
    """A workflow started on the add page (the `start_fields` form) whose own page is read-only: once started it
    changes only through its actions and its services, and it is never deleted (its trail is the audit)."""

    start_fields: list[str] = []

    def get_fields(self, request, obj=None):
        return self.start_fields if obj is None else self.readonly_fields

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    def get_inlines(self, request, obj):
        return [] if obj is None else self.inlines

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False


class TrailInline(ReadOnlyInline):
    """A workflow's audit trail (its step rows) on its page; subclasses name the model."""

    fields = ["at", "step", "event", "message", "task_id", "actor"]
    ordering = ["at", "id"]

    def has_change_permission(self, request, obj=None):
        return False
