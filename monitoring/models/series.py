"""Metric series: the unit (GPU, MIG instance, vGPU) a Sample row is keyed by, and who may see it."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from capacity.choices import SpecKind
from pools.models import Allocation
from tenancy.roles import in_projects_of, sees_all_projects

from ..choices import MetricSource


def _allocations_of(user):
    """Allocations (any time) of the projects `user` may view, as a queryset usable in subqueries.

    Scoped with tenancy.roles.in_projects_of, so the planner starts from the user's own projects' allocations."""
    condition = in_projects_of(user)
    return Allocation.objects.all() if condition is None else Allocation.objects.filter(condition)


class SeriesQuerySet(models.QuerySet):
    def gpus(self):
        return self.filter(mig_instance__isnull=True, vgpu_uuid="")

    def vgpus(self):
        return self.exclude(vgpu_uuid="")

    def mig_instances(self):
        return self.filter(mig_instance__isnull=False)

    def visible_to(self, user):
        """Series of the partitions `user`'s projects hold or held: their MIG instances and full GPUs.

        Time-sliced GPUs are shared between projects, so their GPU-level series are operator-only. A vGPU's
        series is its VM's project's (the VM holding it at the last poll, `vgpu_workload`).
        Points outside the allocation windows are removed by the readers (monitoring/readers/__init__.py).
        """
        if sees_all_projects(user):
            return self
        allocations = _allocations_of(user)
        vms = in_projects_of(user, "vgpu_workload__project_id")
        return self.filter(
            Q(mig_instance__in=allocations.filter(kind=SpecKind.MIG).values("mig_instance"))
            | Q(mig_instance__isnull=True, vgpu_uuid="", gpu__in=allocations.filter(kind=SpecKind.FULL).values("gpu"))
            | (Q(vgpu_workload__isnull=False) & (Q() if vms is None else vms))
        )


class Series(models.Model):
    """A GPU (mig_instance and vgpu_uuid empty), one MIG instance of it, or one vGPU on it (a vm-vgpu host's, by its
    mdev UUID): what a Sample row is keyed by."""

    id = models.AutoField(primary_key=True)
    gpu = models.ForeignKey("capacity.GpuCapacity", on_delete=models.CASCADE, related_name="metric_series")
    mig_instance = models.ForeignKey(
        "capacity.MigInstance", null=True, blank=True, on_delete=models.CASCADE, related_name="metric_series"
    )
    vgpu_uuid = models.CharField(
        max_length=64, blank=True, default="", help_text="The vGPU's mdev UUID (vm-vgpu hosts); empty otherwise."
    )
    vgpu_type = models.CharField(max_length=32, blank=True, default="", help_text="The vGPU's type, H100XM-20C.")
    vgpu_workload = models.ForeignKey(
        "capacity.WorkloadProfile",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The VM (its virt-launcher workload) that held the vGPU at the last poll.",
    )
    mem_total_mib = models.PositiveIntegerField(null=True, blank=True, help_text="Memory of the GPU or instance.")
    source = models.CharField(max_length=8, choices=MetricSource, default=MetricSource.NVML)
    created_at = models.DateTimeField(default=timezone.now)

    objects = SeriesQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        verbose_name = "metric series"
        verbose_name_plural = "metric series"
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(mig_instance__isnull=True, vgpu_uuid=""),
                name="monitoring_series_unique_gpu",
            ),
            models.UniqueConstraint(
                fields=["gpu", "vgpu_uuid"], condition=~Q(vgpu_uuid=""), name="monitoring_series_unique_vgpu"
            ),
            models.UniqueConstraint(
                fields=["mig_instance"],
                condition=Q(mig_instance__isnull=False),
                name="monitoring_series_unique_mig_instance",
            ),
        ]

    def __str__(self) -> str:
        if self.mig_instance_id:
            return f"MIG {self.mig_instance.uuid}"
        if self.vgpu_uuid:
            return f"vGPU {self.vgpu_type} {self.vgpu_uuid}"
        return f"GPU {self.gpu.uuid}"

    @property
    def is_mig(self) -> bool:
        return self.mig_instance_id is not None

    @property
    def is_vgpu(self) -> bool:
        return bool(self.vgpu_uuid)
