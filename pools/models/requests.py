"""A project's pool requests and their audit trail of state changes (pools.services.requests writes both)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from capacity.choices import SpecKind, Tier
from tenancy.models import Project

from ..choices import (
    Isolation,
    IsolationNeed,
    PriorityClass,
    RequestState,
    WorkloadType,
)


class PoolRequestQuerySet(models.QuerySet):
    def pending_first(self):
        """The approval queue's order: submitted requests first, then the rest; newest first in each."""
        return self.order_by(*PENDING_FIRST)

    def holding(self):
        """Requests that hold units now (approved, provisioning, active or failed)."""
        return self.filter(state__in=HOLDING_STATES)


PENDING_FIRST = (
    models.Case(models.When(state=RequestState.SUBMITTED, then=0), default=1).asc(),
    "-created_at",
    "-id",
)
# The same order as an index's expressions (PoolRequest.Meta.indexes).
PENDING_FIRST_INDEX = (
    models.Case(models.When(state=RequestState.SUBMITTED, then=0), default=1),
    models.F("created_at").desc(),
    models.F("id").desc(),
)
PRIORITY_BY_WORKLOAD = {
    WorkloadType.INFERENCE: PriorityClass.PRODUCTION,
    WorkloadType.TRAINING: PriorityClass.PRODUCTION,
    WorkloadType.STAGING: PriorityClass.STAGING,
    WorkloadType.DEVELOPMENT: PriorityClass.DEVELOPMENT,
}
# A request in one of these states holds allocated units until it is released or expires.
HOLDING_STATES = (RequestState.APPROVED, RequestState.PROVISIONING, RequestState.ACTIVE, RequestState.FAILED)


class PoolRequest(models.Model):
    """A project's request for GPU capacity, through draft -> submitted -> approved -> ... -> released."""

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="requests")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="pool_requests"
    )
    name = models.CharField(max_length=100, blank=True)
    workload_type = models.CharField(max_length=16, choices=WorkloadType, default=WorkloadType.INFERENCE)
    isolation = models.CharField(max_length=16, choices=Isolation, default=Isolation.MIG)
    tier = models.CharField(max_length=8, choices=Tier, blank=True)
    cluster = models.ForeignKey(
        "capacity.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="pool_requests"
    )
    product = models.CharField(max_length=32, blank=True, help_text="GPU product if it matters (catalog key).")
    spec_kind = models.CharField(max_length=16, choices=SpecKind, default=SpecKind.MIG)
    profile_name = models.CharField(max_length=32, blank=True, help_text="MIG profile, e.g. 3g.40gb")
    count = models.PositiveIntegerField(validators=[MinValueValidator(1)], default=1)
    memory_gib = models.PositiveIntegerField(null=True, blank=True, help_text="Declared need, if no spec given.")
    compute_fraction = models.DecimalField(max_digits=4, decimal_places=3, null=True, blank=True)
    declared_isolation = models.CharField(
        max_length=16, choices=IsolationNeed, blank=True, help_text="Declared isolation need, when matched."
    )
    offer = models.JSONField(
        default=dict, blank=True, editable=False, help_text="The offer matching chose (pools/matching.py)."
    )
    offer_reason = models.TextField(
        blank=True, editable=False, help_text="Why that offer: the ranking and each rejected alternative."
    )
    start_at = models.DateTimeField(default=timezone.now)
    end_at = models.DateTimeField(null=True, blank=True, help_text="Empty = open-ended.")
    justification = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)
    # The queue (scheduling/queue.py): whether to wait when capacity is short, and in which class.
    wait_if_full = models.BooleanField(
        default=False, help_text="Wait in the queue when capacity is short instead of being refused."
    )
    priority_class = models.CharField(
        max_length=16, choices=PriorityClass, blank=True, help_text="Empty: from the workload type."
    )
    allow_multi_cluster = models.BooleanField(
        default=False, help_text="Approval may take units on several clusters when no one cluster has them all."
    )
    approved_by_policy = models.ForeignKey(
        "pools.AutoApprovalPolicy",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="approved_requests",
        editable=False,
        help_text="The auto-approval policy that approved the request without a person.",
    )
    state = models.CharField(max_length=16, choices=RequestState, default=RequestState.DRAFT, editable=False)
    state_reason = models.TextField(blank=True, editable=False)
    approved_at = models.DateTimeField(null=True, blank=True, editable=False)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    expiry_notice_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the project was told the request is about to expire."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PoolRequestQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("approve_poolrequest", "Can approve or reject pool requests")]
        constraints = [
            models.CheckConstraint(condition=Q(count__gte=1), name="pools_poolrequest_count_positive"),
            models.CheckConstraint(
                condition=Q(end_at__isnull=True) | Q(end_at__gt=models.F("start_at")),
                name="pools_poolrequest_end_after_start",
            ),
        ]
        indexes = [
            models.Index(fields=["project", "state"], name="pools_request_project_state"),
            models.Index(fields=["-created_at", "-id"], name="pools_request_recent"),
            models.Index(fields=["state", "end_at"], name="pools_request_state_end"),
            # The admin's approval queue pages in PENDING_FIRST order: without this index every page sorts
            # all requests (a million of them at fleet scale, seconds); with it, it reads its 100 rows.
            models.Index(*PENDING_FIRST_INDEX, name="pools_request_pending_first"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.project} {self.spec_label} x {self.count} ({self.state})"

    @property
    def effective_priority(self) -> str:
        return self.priority_class or PRIORITY_BY_WORKLOAD.get(self.workload_type, PriorityClass.STAGING)

    @property
    def spec_label(self) -> str:
        if self.spec_kind == SpecKind.MIG:
            return f"{self.product} {self.profile_name}".strip()
        if self.spec_kind == SpecKind.TIMESLICE:
            return f"{self.product} time-slice".strip()
        if self.spec_kind == SpecKind.MPS:
            return f"{self.product} MPS replica".strip()
        if self.spec_kind == SpecKind.VGPU:
            return f"{self.product} vGPU {self.profile_name}".strip()
        return f"{self.product} full GPU".strip()

    def clean(self) -> None:
        if self.end_at and self.start_at and self.end_at <= self.start_at:
            raise ValidationError({"end_at": "The end must be after the start."})
        if self.spec_kind == SpecKind.MIG and not self.profile_name and not self.memory_gib:
            raise ValidationError({"profile_name": "Give a MIG profile or the memory you need."})


class PoolRequestTransition(models.Model):
    """Audit trail: every state change of a request, with who, when and why."""

    request = models.ForeignKey(PoolRequest, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=RequestState)
    to_state = models.CharField(max_length=16, choices=RequestState)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    reason = models.TextField(blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["request_id", "at", "id"]
        indexes = [
            # Metering asks every hour which requests ever failed (billing.services.metering._may_be_credited):
            # a few rows among every request's transitions.
            models.Index(fields=["request"], condition=Q(to_state=RequestState.FAILED), name="pools_transition_failed"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id}: {self.from_state} -> {self.to_state}"
