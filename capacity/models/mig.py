"""The MIG catalog (profiles and their valid placements) and the MIG instances on GPUs."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from ..choices import Availability, MigInstanceState
from .availability import (
    as_boolean,
    availability_case,
    fleet_forms,
    host_conditions,
)
from .inventory import GpuCapacity
from .reservations import Allocation
from .tiers import admitted_q
from .workloads import WorkloadProfile


class MigProfile(models.Model):
    """Catalog of MIG profiles per product, loaded by a data migration from capacity/mig/catalog.py."""

    product = models.CharField(max_length=32, help_text="Catalog key, e.g. H100-80GB.")
    name = models.CharField(max_length=32, help_text="e.g. 3g.40gb or 1g.10gb+me")
    profile_id = models.PositiveSmallIntegerField(help_text="NVML GPU-instance profile id (info.id).")
    compute_slices = models.PositiveSmallIntegerField()
    memory_slices = models.PositiveSmallIntegerField()
    memory_mib = models.PositiveIntegerField()
    multiprocessors = models.PositiveSmallIntegerField(default=0)
    max_instances = models.PositiveSmallIntegerField()
    placements = models.JSONField(default=list, help_text="Valid placement starts (memory-slice index).")

    class Meta:
        ordering = ["product", "-compute_slices", "-memory_slices", "name"]
        constraints = [
            models.UniqueConstraint(fields=["product", "name"], name="capacity_migprofile_unique_product_name"),
        ]

    def __str__(self) -> str:
        return f"{self.product} {self.name}"

    @property
    def resource_name(self) -> str:
        return "nvidia.com/mig-" + self.name.replace("+", ".")

    @property
    def shape(self) -> str:
        return f"{self.compute_slices}G"


class MigPlacement(models.Model):
    """One valid (profile, start) pair. MigInstance points here, so an invalid placement cannot be stored."""

    profile = models.ForeignKey(MigProfile, on_delete=models.CASCADE, related_name="valid_placements")
    start = models.PositiveSmallIntegerField()
    size = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["profile_id", "start"]
        constraints = [
            models.UniqueConstraint(fields=["profile", "start"], name="capacity_migplacement_unique_profile_start"),
        ]

    def __str__(self) -> str:
        return f"{self.profile} @{self.start}:{self.size}"


class MigInstanceQuerySet(models.QuerySet):
    def active(self):
        return self.filter(state=MigInstanceState.ACTIVE, gpu__lost_at__isnull=True)

    def present(self):
        return self.active().filter(gpu__node__gone_at__isnull=True)

    def _unit_conditions(self, table: dict | None = None) -> dict[str, Q]:
        conditions = host_conditions("gpu__")
        conditions[Availability.RECONFIGURING] &= Q(gpu__mig_mode_current=True)  # MIG being switched off
        conditions[Availability.TIER_POLICY] = admitted_q("gpu__", table)  # TierProfilePolicy rows, in SQL
        return conditions

    def _reserved(self) -> Exists:
        return Exists(Allocation.objects.active().filter(mig_instance=OuterRef("pk")))

    def _ending(self) -> Exists:
        return Exists(Allocation.objects.ending().filter(mig_instance=OuterRef("pk")))

    def _in_use(self, busy_devices: frozenset[str] | None) -> Q:
        if busy_devices is None:
            busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
        in_use = Q(Exists(WorkloadProfile.objects.running().filter(mig_instance=OuterRef("pk"))))
        return in_use | Q(uuid__in=sorted(busy_devices)) if busy_devices else in_use

    def annotate_availability(
        self,
        busy_devices: frozenset[str] | None = None,
        *,
        fleet: bool = False,
        table: dict | None = None,
        within: dict | None = None,
    ):
        """Present instances with `availability` and `reserved`, as GpuCapacityQuerySet.annotate_availability().

        `fleet`: for a count over every instance (the dashboard), the same availability written with hashed
        subqueries (availability.fleet_forms) instead of a probe per row; `within` (fleet only): lookups
        that narrow the instances and the holders those subqueries read (`{"gpu_id__in": ids}`, one page
        of the node view; `{"gpu__node__cluster_id__in": ids}`, some clusters). `table`: the tier policies
        as the caller read them (capacity.tiers.policies()), written in as literals (tiers.admitted_q)."""
        conditions = self._unit_conditions(table)
        if fleet:
            if busy_devices is None:
                busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
            reserved, in_use, ending = fleet_forms(
                self.model, "mig_instance", WorkloadProfile.objects.running(), busy_devices, within
            )
            availability = availability_case(conditions, reserved, in_use, ending)
            instances = self.present().filter(**(within or {}))
            return instances.annotate(availability=availability, reserved=as_boolean(reserved))
        reserved = self._reserved()
        availability = availability_case(conditions, reserved, self._in_use(busy_devices), self._ending())
        return self.present().annotate(availability=availability, reserved=reserved)

    def free(self, busy_devices: frozenset[str] | None = None, *, fleet: bool = False):
        """Instances approval may take: availability FREE, as plain filters.

        `fleet`: for a count over every free instance of a spec (approval's read_free), the same rows with
        hashed subqueries (availability.fleet_forms) instead of a probe per instance."""
        if fleet:
            if busy_devices is None:
                busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
            held = fleet_forms(self.model, "mig_instance", WorkloadProfile.objects.running(), busy_devices)
            return self.present().filter(*self._unit_conditions().values(), *(~q for q in held))
        return self.present().filter(
            *self._unit_conditions().values(), ~self._reserved(), ~self._ending(), ~self._in_use(busy_devices)
        )


class MigInstance(models.Model):
    """A MIG GPU instance (with its compute instance) at a placement on a GPU."""

    gpu = models.ForeignKey(GpuCapacity, on_delete=models.PROTECT, related_name="mig_instances")
    profile = models.ForeignKey(MigProfile, on_delete=models.PROTECT, related_name="instances")
    # No index of its own: instances are found by GPU (and placement_start); the catalog rows it points
    # at are never deleted in practice. One index fewer to maintain on the largest discovery table.
    placement = models.ForeignKey(MigPlacement, on_delete=models.PROTECT, related_name="instances", db_index=False)
    placement_start = models.PositiveSmallIntegerField()
    placement_size = models.PositiveSmallIntegerField()
    gi_id = models.PositiveSmallIntegerField(null=True, blank=True)
    ci_id = models.PositiveSmallIntegerField(null=True, blank=True)
    uuid = models.CharField(max_length=100)  # unique through Meta.constraints, as GpuCapacity.uuid
    state = models.CharField(max_length=16, choices=MigInstanceState, default=MigInstanceState.ACTIVE)
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    gone_at = models.DateTimeField(null=True, blank=True)

    objects = MigInstanceQuerySet.as_manager()

    class Meta:
        ordering = ["gpu_id", "placement_start"]
        verbose_name = "MIG instance"
        constraints = [
            models.UniqueConstraint(fields=["uuid"], name="capacity_miginstance_unique_uuid"),
            models.UniqueConstraint(
                fields=["gpu", "placement_start"],
                condition=Q(state="active"),
                name="capacity_miginstance_unique_active_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.profile.name} @{self.placement_start}:{self.placement_size} on {self.gpu.uuid}"

    def clean(self) -> None:
        if self.placement_id and self.profile_id and self.placement.profile_id != self.profile_id:
            raise ValidationError({"placement": "The placement belongs to another profile."})
        if self.placement_id and (self.placement_start, self.placement_size) != (
            self.placement.start,
            self.placement.size,
        ):
            raise ValidationError({"placement_start": "Start and size must match the catalog placement."})
        if (
            self.gpu_id
            and self.profile_id
            and self.gpu.catalog_product
            and self.gpu.catalog_product != self.profile.product
        ):
            raise ValidationError({"profile": f"{self.profile} does not exist on a {self.gpu.catalog_product}."})
        if self.gpu_id and self.state == MigInstanceState.ACTIVE:
            end = self.placement_start + self.placement_size
            overlapping = (
                MigInstance.objects.active()
                .filter(gpu_id=self.gpu_id, placement_start__lt=end)
                .exclude(pk=self.pk)
                .select_related("profile")
            )
            for other in overlapping:
                if other.placement_start + other.placement_size > self.placement_start:
                    raise ValidationError(
                        {"placement_start": f"Overlaps {other.profile.name} at {other.placement_start}."}
                    )
