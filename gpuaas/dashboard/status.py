"""Unit status and profile shape, as the seed product defines them.

A *unit* is what a workload can be given: a MIG instance on a MIG-enabled GPU, or the whole GPU
when MIG is off (a time-sliced GPU is one unit too; its replicas all belong to it).

- In Use: a running workload (capacity.WorkloadProfile with ended_at empty) is bound to the unit,
  through its gpu / mig_instance or, for a pod given several devices, its device_ids.
- Ready: the unit is allocated to a pool (an active pools.Allocation) but nothing runs on it.
- Available: neither.

A workload found on a unit that no pool holds still counts as In Use: the GPU is busy either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from django.db import models
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q

from capacity.mig.catalog import find_product
from capacity.models import GpuCapacity, MigInstance, WorkloadProfile
from pools.models import Allocation


class UnitStatus(models.TextChoices):
    IN_USE = "in_use", "In Use"
    READY = "ready", "Ready"
    AVAILABLE = "available", "Available"


STATUSES = [s.value for s in UnitStatus]
FULL = "full"
SHAPES = ["1g", "2g", "3g", "4g", "7g", FULL]
SHAPE_LABELS = {"1g": "1g", "2g": "2g", "3g": "3g", "4g": "4g", "7g": "7g", FULL: "Full"}


def status_of(in_use: bool, allocated: bool) -> str:
    if in_use:
        return UnitStatus.IN_USE
    if allocated:
        return UnitStatus.READY
    return UnitStatus.AVAILABLE


def shape_of(compute_slices: int | None) -> str:
    """The seed's profile category: "1g".."7g" for a MIG instance, "full" for a whole GPU."""
    return f"{compute_slices}g" if compute_slices else FULL


def gpu_share(catalog_product: str, compute_slices: int | None) -> Fraction:
    """The unit's size in GPUs: 1 for a whole GPU, compute slices / the product's (7; A30: 4) for MIG."""
    if not compute_slices:
        return Fraction(1)
    product = find_product(catalog_product) if catalog_product else None
    return Fraction(compute_slices, product.compute_slices if product else 7)


def memory_slices_of(catalog_product: str) -> int:
    """Memory slices of the GPU's product: 8, or 4 on an A30 (8 when the catalog does not know it)."""
    product = find_product(catalog_product) if catalog_product else None
    return product.memory_slices if product else 8


@dataclass(frozen=True)
class Bound:
    """Units bound through a workload's device list beyond its own gpu / mig_instance foreign key.

    A pod given several devices of one resource (nvidia.com/gpu: 2) is one WorkloadProfile row whose
    gpu is the first device; the others appear only in device_ids. These are resolved here, so a
    two-GPU training pod shows both GPUs In Use.
    """

    gpu_ids: frozenset[int] = frozenset()
    mig_ids: frozenset[int] = frozenset()


def extra_bound_units(workloads=None) -> Bound:
    """Resolve the device ids of running multi-device workloads to GPU and MIG instance ids. 1-3 queries."""
    workloads = WorkloadProfile.objects.running() if workloads is None else workloads
    gpu_uuids, mig_uuids = set(), set()
    for device_ids in workloads.filter(count__gt=1).values_list("device_ids", flat=True):
        for device in device_ids or []:
            if device.startswith("MIG-"):
                mig_uuids.add(device)
            elif device.startswith("GPU-"):
                gpu_uuids.add(device.split("::", 1)[0])  # a time-slice replica "<uuid>::<n>"
    gpu_ids = GpuCapacity.objects.filter(uuid__in=gpu_uuids).values_list("pk", flat=True) if gpu_uuids else []
    mig_ids = MigInstance.objects.filter(uuid__in=mig_uuids).values_list("pk", flat=True) if mig_uuids else []
    return Bound(frozenset(gpu_ids), frozenset(mig_ids))


def mig_bound(extra: Bound = Bound()):
    """True when a running workload is bound to the outer MigInstance."""
    bound = Exists(WorkloadProfile.objects.running().filter(mig_instance=OuterRef("pk")))
    if not extra.mig_ids:
        return bound
    return ExpressionWrapper(Q(bound) | Q(pk__in=sorted(extra.mig_ids)), output_field=BooleanField())


def mig_allocated():
    """Exists(): an active allocation holds the outer MigInstance."""
    return Exists(Allocation.objects.active().filter(mig_instance=OuterRef("pk")))


def gpu_bound(extra: Bound = Bound()):
    """True when a running workload has the outer GpuCapacity as a whole GPU (or a replica of it)."""
    bound = Exists(WorkloadProfile.objects.running().filter(gpu=OuterRef("pk"), mig_instance__isnull=True))
    if not extra.gpu_ids:
        return bound
    return ExpressionWrapper(Q(bound) | Q(pk__in=sorted(extra.gpu_ids)), output_field=BooleanField())


def gpu_allocated():
    """Exists(): an active allocation holds the outer GpuCapacity whole (or one of its time-slice replicas)."""
    return Exists(Allocation.objects.active().filter(gpu=OuterRef("pk"), mig_instance__isnull=True))
