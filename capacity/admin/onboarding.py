"""The cluster page's onboarding console: the dry-run diff, the apply, and each node's agent health.

"Onboard" on a cluster's page opens the diff of what onboarding would apply (capacity.services.onboarding, a
dry-run server-side apply: nothing written); its form applies it (optionally forcing fields another field
manager owns). Operators holding capacity.change_cluster only. The cluster's refusal or unreachability is shown
as the page's error, with nothing recorded but a failed onboarding row when an apply broke off half way.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from tenancy.roles import require_operator_perms

from ..choices import AgentHealth
from ..models import Cluster, ClusterOnboarding, NodeCapacity
from ..services import onboarding

ONBOARD_PERMISSION = "capacity.change_cluster"


class OnboardForm(forms.Form):
    force = forms.BooleanField(
        required=False,
        help_text="Take over fields another field manager (kubectl, another tool) owns with another value.",
    )


class OnboardingAdminMixin:
    """For ClusterAdmin: the onboard view, an "Onboard" link and the agent health table on the change page."""

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<int:pk>/onboard/", view(self.onboard_view), name="capacity_cluster_onboard"),
            *super().get_urls(),
        ]

    def onboard_view(self, request, pk: int):
        require_operator_perms(request.user, ONBOARD_PERMISSION)
        cluster = get_object_or_404(Cluster, pk=pk)
        form = OnboardForm(request.POST if request.method == "POST" else request.GET)
        force = form.is_valid() and form.cleaned_data["force"]
        changes, error = [], ""
        if request.method == "POST" and form.is_valid():
            try:
                row = onboarding.onboard_cluster(cluster, actor=request.user, force=force)
            except onboarding.OnboardingError as exc:
                error = str(exc)
            else:
                counts = row.counts()
                self.message_user(
                    request,
                    f"Onboarded {cluster}: {counts['create']} created, {counts['change']} changed, "
                    f"{counts['unchanged']} unchanged.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(reverse("admin:capacity_cluster_change", args=[cluster.pk]))
        else:
            try:
                changes = onboarding.plan_onboarding(cluster, force=force)
            except onboarding.OnboardingError as exc:
                error = str(exc)
        return TemplateResponse(
            request,
            "admin/capacity/cluster/onboard.html",
            {
                **self.admin_site.each_context(request),
                "opts": Cluster._meta,
                "original": cluster,
                "title": f"Onboard {cluster}",
                "cluster": cluster,
                "form": form,
                "changes": changes,
                "pending": sum(1 for c in changes if c.action != "unchanged"),
                "error": error,
            },
        )

    @admin.display(description="onboarding")
    def onboarding_link(self, obj):
        if obj is None or obj.pk is None:
            return "Save the cluster first."
        last = ClusterOnboarding.objects.filter(cluster=obj).select_related("actor").first()
        url = reverse("admin:capacity_cluster_onboard", args=[obj.pk])
        if last is None:
            state = "never onboarded"
        else:
            who = last.actor.username if last.actor else "—"
            state = f"last {last.status} {last.finished_at:%Y-%m-%d %H:%M} by {who}"
            if last.error:
                state += f": {last.error[:200]}"
        return format_html('<a class="button" href="{}">Onboard…</a> {}', url, state)

    @admin.display(description="node agents")
    def agent_health_table(self, obj):
        if obj is None or obj.pk is None:
            return "—"
        nodes = NodeCapacity.objects.for_cluster(obj).present().order_by("name")
        now = timezone.now()
        labels = dict(AgentHealth.choices)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><strong>{}</strong></td></tr>",
            (
                (
                    n.name,
                    n.agent_version or "—",
                    f"{n.agent_reported_at:%Y-%m-%d %H:%M:%S}" if n.agent_reported_at else "never",
                    labels[n.agent_health(now)],
                )
                for n in nodes
            ),
        )
        if not rows:
            return "No nodes discovered yet."
        return format_html(
            "<table><thead><tr><th>node</th><th>agent version</th><th>last report</th><th>health</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            rows,
        )
