"""Loans: a pool's idle unit lent, as a preemptible unit, to another project (docs/queue.md, Borrowing)."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils import timezone

from tenancy.models import Project

from .choices import LoanState


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

    allocation = models.ForeignKey("pools.Allocation", on_delete=models.PROTECT, related_name="loans")
    lender_pool = models.ForeignKey("pools.GpuPool", on_delete=models.PROTECT, related_name="loans")
    borrower = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="borrowed_units")
    borrower_request = models.ForeignKey(
        "pools.PoolRequest",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="loans",
        help_text="The queued request the loan serves, if any (else the borrower's best-effort workloads).",
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
        ]
        indexes = [models.Index(fields=["borrower", "state"], name="pools_loan_borrower_state")]

    def __str__(self) -> str:
        return f"{self.allocation} lent to {self.borrower.slug}"

    def held_seconds(self, start: datetime, end: datetime) -> int:
        """Seconds the borrower held the unit within [start, end)."""
        until = min(self.returned_at or end, end)
        return max(0, int((until - max(self.started_at, start)).total_seconds()))
