"""Tier placement owned by gpuaas: which tier a node serves, and which MIG profiles each tier carries."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from ..choices import Tier


class TierProfilePolicy(models.Model):
    """The MIG profiles a tier carries, by compute slices (tier 1: 3g and larger; development: 1g/2g).

    A tier without a row follows capacity.tiers.DEFAULT_POLICIES, the seed's recommendation.
    Approval, matching and the MIG planner read it through capacity.tiers.
    """

    tier = models.CharField(max_length=8, choices=Tier, unique=True)
    min_compute_slices = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(8)]
    )
    max_compute_slices = models.PositiveSmallIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(8)]
    )
    notes = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tier"]
        verbose_name_plural = "tier profile policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(min_compute_slices__lte=F("max_compute_slices")),
                name="capacity_tierprofilepolicy_min_le_max",
            ),
        ]

    def __str__(self) -> str:
        return f"tier {self.tier}: {self.min_compute_slices}g..{self.max_compute_slices}g"

    def clean(self) -> None:
        if self.min_compute_slices and self.max_compute_slices and self.min_compute_slices > self.max_compute_slices:
            raise ValidationError({"max_compute_slices": "The largest profile must be at least the smallest."})


class TierAssignment(models.Model):
    """gpuaas owns this node's tier: it writes the `gpuaas.io/tier` label and puts it back when it drifts.

    Nodes without an assignment keep the tier their label says (read by discovery).
    """

    node = models.OneToOneField("capacity.NodeCapacity", on_delete=models.CASCADE, related_name="tier_assignment")
    tier = models.CharField(max_length=8, choices=Tier, blank=True, help_text="Empty: untiered (label removed).")
    assigned_at = models.DateTimeField(auto_now=True)
    assigned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    labelled_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the node's label was last seen or made right."
    )
    last_error = models.TextField(blank=True, editable=False)

    class Meta:
        ordering = ["node_id"]

    def __str__(self) -> str:
        return f"{self.node}: tier {self.tier or '(none)'}"
