"""Reservations: the Allocation row that says "this unit is held", beside the units it holds.

"Free" (capacity's availability) is "no allocation holds it", so the row lives here, below every app that
reads it, the way Saleor keeps Allocation beside Stock. pools creates and ends allocations (approval,
release, moves, ending); its pools and projects are named by reference ("pools.GpuPool", "tenancy.Project").
The table is still `pools_allocation` (moved in capacity.0026, state only: nothing was copied).
"""

from __future__ import annotations

from datetime import timedelta
from fractions import Fraction

from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.db.models.lookups import LessThan
from django.utils import timezone

from policies import policy

from ..choices import SHARED_SPEC_KINDS, AllocationState, SpecKind
from ..mig.share import held_share
from .workloads import WorkloadProfile


class AllocationQuerySet(models.QuerySet):
    def active(self):
        return self.filter(released_at__isnull=True)

    def ending(self):
        """Allocations that ended (released_at set) whose unit some pod of the project may still use: the
        ending sweep (pools/ending.py) evicts those pods and sets vacated_at once none is left."""
        return self.filter(released_at__isnull=False, vacated_at__isnull=True)

    def holding(self):
        """Active or ending: the unit is not another project's to take (capacity's availability reads it)."""
        return self.filter(vacated_at__isnull=True)

    def annotate_busy(self):
        """`busy`: a workload runs on the unit (in_use_condition(), read per row).

        The condition itself, not EXISTS(in_use() of the same row): PostgreSQL turns that self-join into
        one hashed subplan over every allocation of the fleet, whatever page is read (bench fleet)."""
        return self.annotate(busy=models.ExpressionWrapper(self.in_use_condition(), output_field=models.BooleanField()))

    def counted(self, *by: str) -> dict[tuple, tuple[int, Fraction]]:
        """{values of `by`: (units, GPUs)}: the units and their shares of a GPU (capacity.mig.share.held_share),
        summed per value of the `by` fields (fields or annotations). One query."""
        totals: dict[tuple, tuple[int, Fraction]] = {}
        rows = self.values(*dict.fromkeys([*by, *SHARE_FIELDS])).annotate(n=models.Count("pk")).order_by()
        for row in rows:
            key = tuple(row[field] for field in by)
            units, gpus = totals.get(key, (0, Fraction(0)))
            share = held_share(*(row[field] for field in SHARE_FIELDS))
            totals[key] = (units + row["n"], gpus + share * row["n"])
        return totals

    def cluster_id_of(self, allocation_id: int) -> int:
        """The cluster of one allocation's unit: the one to reconcile for it (a pool may span clusters)."""
        return self.filter(pk=allocation_id).values_list("gpu__node__cluster_id", flat=True).get()

    def in_use(self):
        """Units with a running workload on them (in_use_condition())."""
        return self.filter(self.in_use_condition())

    def in_use_condition(self) -> Q:
        """The condition "a running workload is on this unit" (the seed's "In Use" profiles), by the device
        the pod really got.

        The device plugin, not gpuaas, picks which device of a resource a pod gets, so "in use" follows
        the pod's device (WorkloadProfile's GPU or MIG instance, from the kubelet's PodResources, DRA claims or
        NVML), not the reservation: a MIG unit is in use when a pod runs on its instance, a full GPU when a pod
        runs on the GPU. Every (pod, device) pair counts: a pod given several devices is one row whose
        foreign keys name its first device, the others only in `device_ids` (matched by UUID in the JSON
        text, among the few running rows with count > 1). A reservation whose pods ran elsewhere is not in
        use; the unit they ran on is.
        Time-slice replicas have no device of their own, and pods whose device is not known yet have
        none either: those are counted per (project, GPU) and per (project, node, resource): when the
        project runs N of them there, its first N units there (in allocation order) are in use.
        """
        running = WorkloadProfile.objects.running().order_by()
        on_instance = running.filter(mig_instance=models.OuterRef("mig_instance"))
        on_gpu = running.filter(gpu=models.OuterRef("gpu"), mig_instance__isnull=True)
        # A pod given several devices names the others in `device_ids` only (JSON text, matched by UUID).
        several = running.filter(count__gt=1)
        on_other_instance = several.filter(device_ids__icontains=models.OuterRef("mig_instance__uuid"))
        on_other_gpu = several.filter(device_ids__icontains=models.OuterRef("gpu__uuid"))
        by_device = (Q(kind=SpecKind.MIG) & (Q(models.Exists(on_instance)) | Q(models.Exists(on_other_instance)))) | (
            Q(kind=SpecKind.FULL) & (Q(models.Exists(on_gpu)) | Q(models.Exists(on_other_gpu)))
        )
        replicas = self._first_n(
            running.filter(gpu=models.OuterRef("gpu"), mig_instance__isnull=True),
            {"gpu": models.OuterRef("gpu")},
        )
        unresolved = self._first_n(
            running.filter(
                gpu__isnull=True, node=models.OuterRef("gpu__node"), resource_name=models.OuterRef("resource_name")
            ),
            {"gpu__node": models.OuterRef("gpu__node"), "resource_name": models.OuterRef("resource_name")},
        )
        return by_device | (Q(kind__in=SHARED_SPEC_KINDS) & Q(replicas)) | Q(unresolved)

    @staticmethod
    def _first_n(workloads, where: dict):
        """The allocation is among its project's first N units `where`, N being the project's pods counted there."""
        running = (
            workloads.filter(project=models.OuterRef("project"))
            .values("project")
            .annotate(n=models.Sum("count"))
            .values("n")
        )
        before = (
            Allocation.objects.active()
            .filter(project=models.OuterRef("project"), pk__lt=models.OuterRef("pk"), **where)
            .order_by()
            .values("project")
            .annotate(n=models.Count("pk"))
            .values("n")
        )
        return LessThan(Coalesce(models.Subquery(before), 0), models.Subquery(running))


class Allocation(models.Model):
    """One concrete unit held by a pool: a MIG instance, a full GPU, or one time-slice replica of a GPU.

    Partial unique constraints make a double allocation impossible, whatever the application does.
    "Which project holds this MIG instance now" is one query: Allocation.objects.active().filter(mig_instance=...).
    """

    pool = models.ForeignKey("pools.GpuPool", on_delete=models.PROTECT, related_name="allocations")
    project = models.ForeignKey("tenancy.Project", on_delete=models.PROTECT, related_name="allocations")
    kind = models.CharField(max_length=16, choices=SpecKind)
    gpu = models.ForeignKey("capacity.GpuCapacity", on_delete=models.PROTECT, related_name="allocations")
    mig_instance = models.ForeignKey(
        "capacity.MigInstance", null=True, blank=True, on_delete=models.PROTECT, related_name="allocations"
    )
    replica = models.PositiveSmallIntegerField(default=0, help_text="Time-slice replica index; 0 otherwise.")
    resource_name = models.CharField(max_length=100)
    product = models.CharField(max_length=32)
    profile_name = models.CharField(max_length=32, blank=True)
    compute_slices = models.PositiveSmallIntegerField(default=7, help_text="Billing weight of the unit.")
    allocated_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(
        max_length=300,
        blank=True,
        editable=False,
        help_text="Why the unit ended before its pool was released (its MIG instance was destroyed); "
        "the project's statement says so.",
    )

    vacated_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="After the unit ended: when no pod of the project used it any more (the 'ending' state ends). "
        "Until then the unit is handed to no other project.",
    )
    ending_lease_expires_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="While a sweep evicts the unit's pods: another sweep leaves it alone until this passes.",
    )

    objects = AllocationQuerySet.as_manager()

    class Meta:
        db_table = "pools_allocation"  # created by pools.0001; the table, its constraints and indexes keep their names
        ordering = ["pool_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["mig_instance"],
                condition=Q(released_at__isnull=True, mig_instance__isnull=False),
                name="pools_allocation_unique_active_mig_instance",
            ),
            models.UniqueConstraint(
                fields=["gpu", "replica"],
                condition=Q(released_at__isnull=True, mig_instance__isnull=True),
                name="pools_allocation_unique_active_gpu_replica",
            ),
            models.CheckConstraint(
                condition=~Q(kind="mig") | Q(mig_instance__isnull=False), name="pools_allocation_mig_has_instance"
            ),
        ]
        indexes = [
            models.Index(fields=["project", "released_at"], name="pools_alloc_project_active"),
            models.Index(
                fields=["released_at"],
                condition=Q(released_at__isnull=False, vacated_at__isnull=True),
                name="pools_alloc_ending",
            ),
            # "Is this unit ending?" for a page of units (availability's ending term, the node view): a probe
            # into the few ending rows, not into every past allocation of the unit.
            models.Index(
                fields=["mig_instance", "gpu"],
                condition=Q(released_at__isnull=False, vacated_at__isnull=True),
                name="pools_alloc_ending_unit",
            ),
        ]

    def __str__(self) -> str:
        unit = self.profile_name or (f"replica {self.replica}" if self.kind in SHARED_SPEC_KINDS else "full GPU")
        return f"{self.pool}: {self.product} {unit} on {self.gpu.uuid}"

    @property
    def state(self) -> str:
        """AllocationState: active, ending (released, its pods not gone yet) or ended."""
        if self.released_at is None:
            return AllocationState.ACTIVE
        return AllocationState.ENDING if self.vacated_at is None else AllocationState.ENDED

    @property
    def evict_after(self):
        """When an ending unit's pods are evicted (released_at + ALLOCATION_ENDING_GRACE_S); None unless ending."""
        if self.released_at is None or self.vacated_at is not None:
            return None
        return self.released_at + timedelta(seconds=policy("ALLOCATION_ENDING_GRACE_S"))

    def share(self) -> Fraction:
        """The unit's share of a GPU (capacity.mig.share.held_share). Reads gpu.node: select_related it in loops."""
        return held_share(
            self.kind, self.product, self.profile_name, self.compute_slices, self.gpu.node.timeslice_replicas
        )


# What an allocation's share of a GPU is computed from (held_share's arguments, in order).
SHARE_FIELDS = ("kind", "product", "profile_name", "compute_slices", "gpu__node__timeslice_replicas")
