"""Loans: a pool's idle unit lent, as a preemptible unit, to another project (docs/queue.md, Borrowing)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Count, Q
from django.utils import timezone

from capacity.choices import SpecKind
from tenancy.models import Project

from ..choices import BestEffortState, LoanState


class LoanQuerySet(models.QuerySet):
    def open(self):
        """Loans not ended: lent, or lent and being reclaimed."""
        return self.exclude(state=LoanState.ENDED)

    def granted(self):
        """Loans whose unit the borrower may start pods on (reclaiming loans no longer count in its quota)."""
        return self.filter(state=LoanState.ACTIVE)

    def overlapping(self, start: datetime, end: datetime):
        """Loans that held their unit for some time in [start, end)."""
        return self.filter(started_at__lt=end).filter(Q(returned_at__isnull=True) | Q(returned_at__gt=start))


class Loan(models.Model):
    """One unit of a lender's pool, lent to a borrower project until the lender needs it back.

    The lender's guarantee stands: its allocation is never released by a loan; the borrower only gets
    quota (device plugin) or a claim template (DRA) for the unit and runs under the low PriorityClass.
    `returned_at` is when the unit was the lender's again (borrower's pods evicted, quota restored):
    the borrower is billed, and the lender credited, for started_at..returned_at.
    """

    allocation = models.ForeignKey("capacity.Allocation", on_delete=models.PROTECT, related_name="loans")
    lender_pool = models.ForeignKey("pools.GpuPool", on_delete=models.PROTECT, related_name="loans")
    borrower = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="borrowed_units")
    borrower_request = models.ForeignKey(
        "pools.PoolRequest",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="loans",
        help_text="The queued request the loan serves, if any.",
    )
    best_effort = models.ForeignKey(
        "pools.BestEffortRequest",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="loans",
        help_text="The best-effort request the loan serves, if any.",
    )
    state = models.CharField(max_length=16, choices=LoanState, default=LoanState.ACTIVE, editable=False)
    started_at = models.DateTimeField(default=timezone.now)
    reclaim_requested_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the lender needed the unit back."
    )
    returned_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the unit was the lender's again (billing ends)."
    )
    reason = models.CharField(max_length=200, blank=True, editable=False, help_text="Why the loan ended.")
    evicted_pods = models.JSONField(default=list, blank=True, editable=False)

    objects = LoanQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["allocation"], condition=~Q(state="ended"), name="pools_loan_unique_open_allocation"
            ),
            models.CheckConstraint(
                condition=Q(state="ended") | Q(returned_at__isnull=True), name="pools_loan_returned_only_when_ended"
            ),
            models.CheckConstraint(
                condition=Q(borrower_request__isnull=True) | Q(best_effort__isnull=True),
                name="pools_loan_one_borrowing_request",
            ),
        ]
        indexes = [models.Index(fields=["borrower", "state"], name="pools_loan_borrower_state")]

    def __str__(self) -> str:
        return f"{self.allocation} lent to {self.borrower.slug}"

    def held_seconds(self, start: datetime, end: datetime) -> int:
        """Seconds the borrower held the unit within [start, end)."""
        until = min(self.returned_at or end, end)
        return max(0, int((until - max(self.started_at, start)).total_seconds()))


class BestEffortRequestQuerySet(models.QuerySet):
    def open(self):
        return self.filter(state=BestEffortState.OPEN)

    def with_units_held(self):
        """`units_held`: its open loans (lent, or in their grace period) now."""
        return self.annotate(units_held=Count("loans", filter=~Q(loans__state=LoanState.ENDED)))

    def servable(self, at: datetime):
        """Open requests whose `until` has not come: lend_idle serves these, oldest first."""
        return self.open().filter(Q(until__isnull=True) | Q(until__gt=at)).order_by("created_at", "pk")


class BestEffortRequest(models.Model):
    """A project's standing ask for preemptible units of a spec, served only from other projects' idle units.

    Its own small table rather than a PoolRequest with a flag: a PoolRequest is a claim on guaranteed
    units, and everything reading that table (approval, the queue and its fair share, the forecast's
    arrivals, expiry, pools, the project page) would have to learn to skip these rows. A best-effort
    request is never approved, never queued, never refused for shortage: `open` until its project ends
    it or `until` passes. monitoring.services.lending.lend_idle lends to it after the queue's waiting
    requests; each unit it gets is a Loan (reclaimed like any loan, billed at the best-effort rate).
    """

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="best_effort_requests")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    spec_kind = models.CharField(max_length=16, choices=SpecKind, default=SpecKind.MIG)
    product = models.CharField(max_length=32, blank=True, help_text="GPU product if it matters (catalog key).")
    profile_name = models.CharField(max_length=32, blank=True, help_text="MIG profile, e.g. 3g.40gb")
    cluster = models.ForeignKey(
        "capacity.Cluster", null=True, blank=True, on_delete=models.PROTECT, related_name="best_effort_requests"
    )
    count = models.PositiveIntegerField(validators=[MinValueValidator(1)], default=1)
    until = models.DateTimeField(null=True, blank=True, help_text="Served until then (empty: until ended).")
    state = models.CharField(max_length=16, choices=BestEffortState, default=BestEffortState.OPEN, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    ended_at = models.DateTimeField(null=True, blank=True, editable=False)
    end_reason = models.CharField(max_length=200, blank=True, editable=False)

    objects = BestEffortRequestQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(count__gte=1), name="pools_besteffortrequest_count_positive"),
            models.CheckConstraint(
                condition=Q(state="ended") | Q(ended_at__isnull=True),
                name="pools_besteffortrequest_ended_only_when_ended",
            ),
        ]
        indexes = [models.Index(fields=["state", "created_at"], name="pools_besteffort_state_created")]

    def __str__(self) -> str:
        return f"best-effort #{self.pk} of {self.project.slug}: {self.count} x {self.spec_label}"

    @property
    def spec_label(self) -> str:
        if self.spec_kind == SpecKind.MIG:
            return f"{self.product} {self.profile_name}".strip()
        if self.spec_kind == SpecKind.FULL:
            return f"{self.product} full GPU".strip()
        return f"{self.product} {self.spec_kind} {self.profile_name}".strip()
