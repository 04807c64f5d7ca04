"""Unit status and profile shape as the dashboard shows them: approval's availability, in the seed's words.

A *unit* is what a workload can be given: a MIG instance on a MIG-enabled GPU, or the whole GPU
when MIG is off (a time-sliced GPU is one unit too; its replicas all belong to it). Its status is
its capacity.choices.Availability (MigInstance/GpuCapacity .annotate_availability(), the definition
approval uses), named as the seed product names it:

- In Use: a running workload is bound to the unit (a workload on a unit no pool holds counts too).
- Ready: an active pools.Allocation holds the unit but nothing runs on it.
- Available: approval could give it out now (Availability.FREE).
- Withheld by tier policy: free otherwise, but its node's tier does not admit its MIG profile
  (Availability.TIER_POLICY, TierProfilePolicy: "tier 1 takes 3g and larger"), so approval never gives
  it out while the policy stands. Counted apart from Available, named with the tier's rule
  (capacity.tiers.withheld_label) on the node view, the form's check, the dry run, the forecast and approval.
- Unavailable: neither held nor busy, but approval would not give it out: its GPU is unhealthy,
  its node cordoned or not ready, or its node or GPU is in the middle of a MIG change.
"""

from __future__ import annotations

from django.db import models

from capacity.choices import Availability
from capacity.mig.catalog import find_product


class UnitStatus(models.TextChoices):
    IN_USE = "in_use", "In Use"
    READY = "ready", "Ready"
    AVAILABLE = "available", "Available"
    TIER_POLICY = "tier_policy", "Withheld by tier policy"
    UNAVAILABLE = "unavailable", "Unavailable"


STATUSES = [s.value for s in UnitStatus]
FULL = "full"
SHAPES = ["1g", "2g", "3g", "4g", "7g", FULL]
SHAPE_LABELS = {"1g": "1g", "2g": "2g", "3g": "3g", "4g": "4g", "7g": "7g", FULL: "Full"}
_STATUS_OF = {
    Availability.IN_USE: UnitStatus.IN_USE,
    Availability.RESERVED: UnitStatus.READY,
    Availability.FREE: UnitStatus.AVAILABLE,
    Availability.TIER_POLICY: UnitStatus.TIER_POLICY,
}


def status_of(availability: str) -> str:
    """The dashboard status of a unit of `availability` (unhealthy, cordoned, reconfiguring: Unavailable)."""
    return _STATUS_OF.get(availability, UnitStatus.UNAVAILABLE)


def shape_of(compute_slices: int | None) -> str:
    """The seed's profile category: "1g".."7g" for a MIG instance, "full" for a whole GPU."""
    return f"{compute_slices}g" if compute_slices else FULL


# What a project holds (pools.Allocation) is also a time-slice replica or a vGPU: a share of a GPU, never "Full".
TIMESLICE, MPS, VGPU = "timeslice", "mps", "vgpu"  # capacity.choices.SpecKind values
HELD_SHAPES = [*SHAPES, TIMESLICE, MPS, VGPU]
HELD_SHAPE_LABELS = SHAPE_LABELS | {TIMESLICE: "Time-slice", MPS: "MPS share", VGPU: "vGPU"}


def held_shape(kind: str, compute_slices: int | None) -> str:
    """The shape of a held unit: a MIG instance's 1g..7g, "timeslice" or "vgpu" for a share, "full" for a GPU."""
    if kind in (TIMESLICE, MPS, VGPU):
        return kind
    return shape_of(compute_slices) if kind == "mig" else FULL


def gpus_text(gpus: float) -> str:
    """A number of GPUs as a page prints it: 0.5, 1.5, 0.43, 8 (two decimal places at most)."""
    return f"{round(gpus, 2):g}"


def memory_slices_of(catalog_product: str) -> int:
    """Memory slices of the GPU's product: 8, or 4 on an A30 (8 when the catalog does not know it)."""
    product = find_product(catalog_product) if catalog_product else None
    return product.memory_slices if product else 8
