"""The admin's bulk actions on workflows (reconfigurations, drains, rolling upgrades): one service call per
selected row, a count of what it did and a warning for each row whose state refused it."""

from __future__ import annotations

from django.contrib import messages
from django.utils.translation import ngettext

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
