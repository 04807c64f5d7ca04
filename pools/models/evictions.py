"""The audit of every eviction gpuaas makes when a reservation or a loan ends (pools/ending.py, pools/lending.py)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..choices import EvictionOutcome


class Eviction(models.Model):
    """One attempt to take a pod off a unit that is no longer its project's: through the Eviction API
    (PodDisruptionBudgets respected; a 429 is `blocked` and retried at the next sweep) or, past the hard
    deadline, a delete (`forced`). For an ended allocation (`allocation`) or an ended loan (`loan`)."""

    allocation = models.ForeignKey(
        "capacity.Allocation", null=True, blank=True, on_delete=models.PROTECT, related_name="evictions"
    )
    loan = models.ForeignKey("pools.Loan", null=True, blank=True, on_delete=models.PROTECT, related_name="evictions")
    project = models.ForeignKey(
        "tenancy.Project",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The pod's project (its namespace's), when it has one.",
    )
    namespace = models.CharField(max_length=253)
    pod_name = models.CharField(max_length=253)
    outcome = models.CharField(max_length=16, choices=EvictionOutcome)
    reason = models.CharField(max_length=300, blank=True, help_text="Why the pod had to go.")
    detail = models.TextField(blank=True, help_text="The API server's answer, when it refused.")
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(allocation__isnull=False) | Q(loan__isnull=False), name="pools_eviction_for_something"
            ),
        ]
        indexes = [models.Index(fields=["-at", "-id"], name="pools_eviction_recent")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod_name}: {self.outcome}"
