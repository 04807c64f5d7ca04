"""What each node offers, by spec (the seed's SpecAndCount)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q, Sum
from django.utils import timezone

from ..choices import SpecKind
from .inventory import NodeCapacity
from .mig import MigProfile


class SpecAndCountQuerySet(models.QuerySet):
    def present(self):
        return self.filter(node__gone_at__isnull=True)

    def totals(self):
        """Fleet or cluster totals by spec: "H100-80GB 3g.40gb x 12"."""
        return (
            self.present()
            .values("kind", "product", "profile_name", "resource_name")
            .annotate(count=Sum("count"), allocatable=Sum("allocatable"))
            .order_by("product", "kind", "profile_name")
        )


class SpecAndCount(models.Model):
    """What one node offers, by spec: full GPUs of a product, a MIG profile, or time-slice replicas.

    One row per (node, extended resource); "what does this node offer" is one query.
    """

    node = models.ForeignKey(NodeCapacity, on_delete=models.CASCADE, related_name="specs")
    kind = models.CharField(max_length=16, choices=SpecKind)
    product = models.CharField(max_length=32, help_text="Catalog key or GFD product of the parent GPU.")
    profile = models.ForeignKey(MigProfile, null=True, blank=True, on_delete=models.PROTECT, related_name="offers")
    profile_name = models.CharField(max_length=32, blank=True)
    resource_name = models.CharField(max_length=100, help_text="e.g. nvidia.com/mig-3g.40gb")
    count = models.PositiveIntegerField(default=0, help_text="status.capacity")
    allocatable = models.PositiveIntegerField(default=0, help_text="status.allocatable")
    replicas = models.PositiveSmallIntegerField(default=1)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = SpecAndCountQuerySet.as_manager()

    class Meta:
        ordering = ["node_id", "kind", "resource_name"]
        verbose_name = "spec and count"
        verbose_name_plural = "specs and counts"
        constraints = [
            models.UniqueConstraint(
                fields=["node", "resource_name"], name="capacity_specandcount_unique_node_resource"
            ),
            models.CheckConstraint(
                condition=~Q(kind="mig") | Q(profile__isnull=False), name="capacity_specandcount_mig_has_profile"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.label} x {self.count}"

    @property
    def label(self) -> str:
        if self.kind == SpecKind.MIG:
            return f"{self.product} {self.profile_name}"
        if self.kind == SpecKind.TIMESLICE:
            return f"{self.product} 1/{self.replicas} time-slice"
        if self.kind == SpecKind.MPS:
            return f"{self.product} 1/{self.replicas} MPS client"
        if self.kind == SpecKind.VGPU:
            return f"{self.product} vGPU {self.profile_name}"
        return f"{self.product} full GPU"
