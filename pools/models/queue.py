"""The queue's tables: auto-approval policies, per-project weights, queue entries and their audit trail.

Kept apart from pools/models/ (which imports them at its end, so Django finds them) because they
belong to one feature, the queue (pools/queue.py, pools/policies.py, pools/forecast.py).
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from capacity.choices import SpecKind, Tier
from tenancy.models import Project

from ..choices import QueueAction, RequestState


def window_error(start: dt.time | None, end: dt.time | None) -> str | None:
    """What is wrong with a policy's time window, or None (the model's clean() and the API share it)."""
    if (start is None) != (end is None):
        return "Give both ends of the time window, or neither."
    if start is not None and start == end:
        return "The window is empty: leave both ends empty for all day."
    return None


class AutoApprovalPolicyQuerySet(models.QuerySet):
    def enabled(self):
        return self.filter(enabled=True)


class AutoApprovalPolicy(models.Model):
    """An operator's rule: requests it matches are approved without a person when capacity allows.

    Empty conditions match anything: no projects and no group = every project, no tier = any tier.
    The time window is in UTC; a window whose start is after its end runs over midnight.
    """

    # The rule's conditions, in the order its API and admin list show them.
    RULE_FIELDS = (
        "project_group",
        "tier",
        "spec_kind",
        "profile_name",
        "max_units",
        "max_duration_h",
        "window_start",
        "window_end",
    )

    name = models.CharField(max_length=100, unique=True)
    enabled = models.BooleanField(default=True)
    projects = models.ManyToManyField(Project, blank=True, related_name="auto_approval_policies")
    project_group = models.CharField(
        max_length=64, blank=True, help_text="Projects of this cost centre (tenancy Project.cost_centre)."
    )
    tier = models.CharField(max_length=8, choices=Tier, blank=True)
    spec_kind = models.CharField(max_length=16, choices=SpecKind, blank=True)
    profile_name = models.CharField(max_length=32, blank=True, help_text="MIG profile, e.g. 3g.40gb; empty = any.")
    max_units = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_duration_h = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Open-ended requests never match a maximum."
    )
    window_start = models.TimeField(null=True, blank=True, help_text="UTC; empty with window_end = all day.")
    window_end = models.TimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AutoApprovalPolicyQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]
        verbose_name_plural = "auto-approval policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(window_start__isnull=True, window_end__isnull=True)
                | Q(window_start__isnull=False, window_end__isnull=False),
                name="pools_autoapprovalpolicy_window_both_or_neither",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        error = window_error(self.window_start, self.window_end)
        if error:
            raise ValidationError({"window_end": error})

    def in_window(self, at: dt.datetime) -> bool:
        if self.window_start is None:
            return True
        moment = at.astimezone(dt.UTC).time()
        if self.window_start < self.window_end:
            return self.window_start <= moment < self.window_end
        return moment >= self.window_start or moment < self.window_end

    def allows(self, request, at: dt.datetime, *, project_ids: set[int] | None = None) -> bool:
        """Whether this policy approves `request` at `at`. `project_ids` saves a query in loops."""
        if not self.enabled or not self.in_window(at):
            return False
        if self.tier and request.tier != self.tier:
            return False
        if self.spec_kind and request.spec_kind != self.spec_kind:
            return False
        if self.profile_name and request.profile_name != self.profile_name:
            return False
        if self.max_units is not None and request.count > self.max_units:
            return False
        if self.max_duration_h is not None:
            if request.end_at is None:
                return False
            if (request.end_at - max(request.start_at, at)) > dt.timedelta(hours=self.max_duration_h):
                return False
        if project_ids is None:
            project_ids = set(self.projects.values_list("pk", flat=True))
        scoped = bool(project_ids) or bool(self.project_group)
        if not scoped:
            return True
        if request.project_id in project_ids:
            return True
        return bool(self.project_group) and request.project.cost_centre == self.project_group


class ProjectQueueWeight(models.Model):
    """An operator's weight for a project's fair share: twice the weight, twice the GPU-hours before it yields."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="queue_weight")
    weight = models.DecimalField(max_digits=6, decimal_places=2, default=1, validators=[MinValueValidator(0.01)])

    class Meta:
        ordering = ["project_id"]
        constraints = [models.CheckConstraint(condition=Q(weight__gt=0), name="pools_projectqueueweight_positive")]

    def __str__(self) -> str:
        return f"{self.project}: {self.weight}"


class QueueEntryQuerySet(models.QuerySet):
    def waiting(self):
        return self.filter(request__state=RequestState.QUEUED)

    def started(self):
        """Entries whose request was approved out of the queue: their first forecast can be scored."""
        return self.filter(request__approved_at__isnull=False, first_p50__isnull=False)


class QueueEntry(models.Model):
    """A request's place in the queue, its latest forecast, and the first forecast (kept, to score it).

    Kept after the request leaves the queue: predicted vs actual start is the forecast's accuracy.
    """

    request = models.OneToOneField("pools.PoolRequest", on_delete=models.CASCADE, related_name="queue_entry")
    queued_at = models.DateTimeField()
    manual_rank = models.IntegerField(
        null=True, blank=True, editable=False, help_text="Set by an operator's move: ranked entries come first."
    )
    on_hold = models.BooleanField(default=False, editable=False)
    approvable_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Since when capacity would allow approving it now."
    )
    forecast_p50 = models.DateTimeField(null=True, blank=True, editable=False)
    forecast_p90 = models.DateTimeField(null=True, blank=True, editable=False)
    forecast_basis = models.JSONField(default=dict, blank=True, editable=False)
    forecast_at = models.DateTimeField(null=True, blank=True, editable=False)
    first_p50 = models.DateTimeField(null=True, blank=True, editable=False, help_text="Forecast when queued.")
    first_p90 = models.DateTimeField(null=True, blank=True, editable=False)
    operator_approved_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="An operator approved it while capacity was short: it is approved when capacity frees.",
    )
    operator_approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    running_on_loan_since = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="Since when open loans cover its whole count (it runs on lent units); empty when they do not.",
    )
    first_on_loan_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When lent units first covered its whole count (kept)."
    )

    objects = QueueEntryQuerySet.as_manager()

    class Meta:
        ordering = ["queued_at", "id"]
        verbose_name_plural = "queue entries"

    def __str__(self) -> str:
        return f"queue entry of #{self.request_id}"


class QueueEvent(models.Model):
    """The queue's audit trail: queued, moved, held, released from hold, cancelled, approved, flagged."""

    request = models.ForeignKey("pools.PoolRequest", on_delete=models.CASCADE, related_name="queue_events")
    action = models.CharField(max_length=16, choices=QueueAction)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    policy = models.ForeignKey(AutoApprovalPolicy, null=True, blank=True, on_delete=models.SET_NULL)
    detail = models.TextField(blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["request_id", "at", "id"]

    def __str__(self) -> str:
        return f"#{self.request_id} {self.action} at {self.at:%Y-%m-%d %H:%M}"
