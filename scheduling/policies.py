"""Auto-approval policies: which rule, if any, approves a request without a person.

The rule itself is AutoApprovalPolicy.allows(); this module picks the first enabled policy (by name)
that allows a request, loading every policy's projects in one query so the queue can ask for each
request it looks at.
"""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from pools.models.queue import AutoApprovalPolicy


class PolicyBook:
    """The enabled policies with their project ids, loaded once for a pass over the queue."""

    def __init__(self):
        self.policies = list(AutoApprovalPolicy.objects.enabled().prefetch_related("projects").order_by("name", "pk"))
        self.projects = {p.pk: {project.pk for project in p.projects.all()} for p in self.policies}

    def first_allowing(self, request, at: dt.datetime | None = None) -> AutoApprovalPolicy | None:
        at = at or timezone.now()
        for policy in self.policies:
            if policy.allows(request, at, project_ids=self.projects[policy.pk]):
                return policy
        return None


def policy_for(request, at: dt.datetime | None = None) -> AutoApprovalPolicy | None:
    """The first enabled policy that approves `request` at `at` (now), or None."""
    return PolicyBook().first_allowing(request, at)
