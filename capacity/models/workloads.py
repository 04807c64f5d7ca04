"""Running workloads: which pod runs on which GPU or MIG instance (the seed's Profile); a KubeVirt VM is the
virt-launcher pod that holds its vGPU, named by `vmi_name`."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from .clusters import Cluster


class WorkloadProfileQuerySet(models.QuerySet):
    def running(self):
        return self.filter(ended_at__isnull=True)

    def multi_device_uuids(self) -> frozenset[str]:
        """GPU and MIG UUIDs held by pods given several devices of one resource. One query.

        Such a pod is one row whose gpu / mig_instance is its first device; the others appear only in
        `device_ids` (a time-slice replica as `<uuid>::<n>`, reduced here to the device).
        """
        uuids: set[str] = set()
        for ids in self.filter(count__gt=1).values_list("device_ids", flat=True):
            uuids.update(device_id.split("::")[0] for device_id in ids or ())
        return frozenset(uuids)


class WorkloadProfile(models.Model):
    """The seed's Profile: which pod runs on which GPU or MIG instance (workload tracking)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="workloads")
    namespace = models.CharField(max_length=63)
    pod_name = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    # By name: the unit querysets read running workloads, so the unit models' module imports this one.
    node = models.ForeignKey(
        "capacity.NodeCapacity", null=True, blank=True, on_delete=models.PROTECT, related_name="workloads"
    )
    gpu = models.ForeignKey(
        "capacity.GpuCapacity", null=True, blank=True, on_delete=models.PROTECT, related_name="workloads"
    )
    mig_instance = models.ForeignKey(
        "capacity.MigInstance", null=True, blank=True, on_delete=models.PROTECT, related_name="workloads"
    )
    device_ids = models.JSONField(default=list, blank=True)
    vmi_name = models.CharField(
        max_length=253,
        blank=True,
        default="",
        help_text="The KubeVirt VirtualMachineInstance the pod (its virt-launcher) runs; empty for a container.",
    )
    resource_name = models.CharField(max_length=100)
    count = models.PositiveSmallIntegerField(default=1)
    project = models.ForeignKey(
        "tenancy.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="workloads"
    )
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    objects = WorkloadProfileQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "id"]
        verbose_name = "workload profile"
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "pod_uid", "resource_name"], name="capacity_workloadprofile_unique_pod_resource"
            ),
        ]
        indexes = [models.Index(fields=["cluster", "ended_at"], name="capacity_workload_running")]

    def __str__(self) -> str:
        if self.vmi_name:
            return f"{self.namespace}/{self.vmi_name} (VM, {self.resource_name})"
        return f"{self.namespace}/{self.pod_name} ({self.resource_name})"
