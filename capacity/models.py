"""Capacity: clusters, GPU nodes and devices, MIG instances, offered specs and running workloads.

Names follow the seed product: NodeCapacity (a GPU node), GpuCapacity (a GPU device), SpecAndCount
(what a node offers, by spec), WorkloadProfile (the seed's "Profile": which pod runs on which GPU or
MIG instance). The cluster owns most of these facts; gpuaas mirrors them through discovery.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Count, Q, Sum
from django.utils import timezone

from . import credentials
from .choices import ClusterStatus, DiscoveryStatus, GpuHealth, MigInstanceState, MigStrategy, SpecKind, Tier


class Cluster(models.Model):
    """A registered Kubernetes cluster. Credentials are a kubeconfig path or an encrypted kubeconfig."""

    name = models.SlugField(max_length=63, unique=True)
    api_endpoint = models.CharField(max_length=500, blank=True, help_text="Informational; the kubeconfig decides.")
    kubeconfig_path = models.CharField(
        max_length=500,
        blank=True,
        help_text="Kubeconfig path on the gpuaas hosts (a reference, not a secret).",
    )
    kubeconfig_context = models.CharField(max_length=200, blank=True)
    in_cluster = models.BooleanField(default=False, help_text="Use the pod's service account (gpuaas runs inside).")
    encrypted_kubeconfig = models.TextField(blank=True, editable=False)
    dcgm_exporter_url = models.CharField(
        max_length=500, blank=True, help_text="Optional DCGM exporter endpoint(s) to scrape, comma-separated."
    )
    status = models.CharField(max_length=16, choices=ClusterStatus, default=ClusterStatus.NEW, editable=False)
    last_discovery_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_success_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not (self.kubeconfig_path or self.in_cluster or self.encrypted_kubeconfig):
            raise ValidationError({"kubeconfig_path": "Give a kubeconfig path, an uploaded kubeconfig or in-cluster."})

    def set_kubeconfig(self, text: str) -> None:
        """Store a kubeconfig encrypted; the plain text never reaches the database."""
        self.encrypted_kubeconfig = credentials.encrypt(text)

    def kubeconfig_text(self) -> str | None:
        return credentials.decrypt(self.encrypted_kubeconfig) if self.encrypted_kubeconfig else None


class DiscoveryRun(models.Model):
    """One discovery pass over a cluster: the admin and API read this, never Celery's results."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="discovery_runs")
    status = models.CharField(max_length=16, choices=DiscoveryStatus, default=DiscoveryStatus.RUNNING)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    nodes_seen = models.PositiveIntegerField(default=0)
    gpus_seen = models.PositiveIntegerField(default=0)
    nodes_gone = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    task_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["cluster", "-started_at"], name="capacity_discoveryrun_recent")]

    def __str__(self) -> str:
        return f"{self.cluster} @ {self.started_at:%Y-%m-%d %H:%M:%S} ({self.status})"


class NodeCapacityQuerySet(models.QuerySet):
    def present(self):
        return self.filter(gone_at__isnull=True)

    def for_cluster(self, cluster):
        return self.filter(cluster=cluster)

    def schedulable(self):
        return self.present().filter(ready=True, cordoned=False)

    def with_counts(self):
        return self.annotate(
            gpus_present=Count("gpus", filter=Q(gpus__lost_at__isnull=True), distinct=True),
            mig_instances=Count("gpus__mig_instances", filter=Q(gpus__mig_instances__state="active"), distinct=True),
        )


class NodeCapacity(models.Model):
    """A GPU node of a cluster: the seed's NodeCapacity. Never deleted: a vanished node is marked gone."""

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="nodes")
    name = models.CharField(max_length=253)
    gpu_product = models.CharField(max_length=100, blank=True, help_text="nvidia.com/gpu.product as GFD labels it.")
    gpu_count = models.PositiveSmallIntegerField(default=0, help_text="Physical GPUs (nvidia.com/gpu.count).")
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    tier = models.CharField(max_length=8, choices=Tier, blank=True, default=Tier.NONE)
    node_group = models.CharField(max_length=100, blank=True, help_text="Label gpuaas.io/node-group.")
    mig_strategy = models.CharField(max_length=8, choices=MigStrategy, default=MigStrategy.NONE)
    mig_config = models.CharField(max_length=100, blank=True, help_text="nvidia.com/mig.config")
    mig_config_state = models.CharField(max_length=16, blank=True, help_text="nvidia.com/mig.config.state")
    timeslice_replicas = models.PositiveSmallIntegerField(default=1)
    ready = models.BooleanField(default=False)
    cordoned = models.BooleanField(default=False)
    labels = models.JSONField(default=dict, blank=True)
    capacity = models.JSONField(default=dict, blank=True, help_text="Physical: status.capacity.")
    allocatable = models.JSONField(default=dict, blank=True, help_text="Logical: status.allocatable.")
    resource_version = models.CharField(max_length=64, blank=True)
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    gone_at = models.DateTimeField(null=True, blank=True)

    objects = NodeCapacityQuerySet.as_manager()

    class Meta:
        ordering = ["cluster_id", "name"]
        verbose_name = "node capacity"
        verbose_name_plural = "node capacities"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="capacity_nodecapacity_unique_cluster_name"),
        ]
        indexes = [models.Index(fields=["cluster", "gone_at"], name="capacity_node_cluster_gone")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}" if self.cluster_id else self.name

    @property
    def queue(self) -> str:
        from gpuaas.celery import node_queue

        return node_queue(self.cluster.name, self.name)

    @property
    def is_gone(self) -> bool:
        return self.gone_at is not None


class GpuCapacityQuerySet(models.QuerySet):
    def present(self):
        return self.filter(lost_at__isnull=True, node__gone_at__isnull=True)

    def healthy(self):
        return self.present().filter(health__in=[GpuHealth.OK, GpuHealth.WARNING])

    def for_cluster(self, cluster):
        return self.filter(node__cluster=cluster)


class GpuCapacity(models.Model):
    """One physical GPU: the seed's GpuCapacity. A GPU that falls off the bus is marked lost, not deleted."""

    node = models.ForeignKey(NodeCapacity, on_delete=models.PROTECT, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    product = models.CharField(max_length=100, help_text="NVML device name, e.g. NVIDIA H100 80GB HBM3.")
    catalog_product = models.CharField(max_length=32, blank=True, help_text="MIG catalog key, e.g. H100-80GB.")
    memory_mib = models.PositiveIntegerField(default=0)
    mig_mode_current = models.BooleanField(default=False)
    mig_mode_pending = models.BooleanField(default=False)
    health = models.CharField(max_length=16, choices=GpuHealth, default=GpuHealth.OK)
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_version = models.CharField(max_length=16, blank=True)
    serial = models.CharField(max_length=32, blank=True)
    pci_bus_id = models.CharField(max_length=32, blank=True)
    last_seen_at = models.DateTimeField(default=timezone.now)
    lost_at = models.DateTimeField(null=True, blank=True)

    objects = GpuCapacityQuerySet.as_manager()

    class Meta:
        ordering = ["node_id", "index"]
        verbose_name = "GPU capacity"
        verbose_name_plural = "GPU capacities"
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=Q(lost_at__isnull=True),
                name="capacity_gpucapacity_unique_node_index",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node} GPU {self.index} ({self.uuid})"

    def mig_layout(self):
        """Active MIG instances with their placements, in slice order: the GPU's MIG picture."""
        return (
            self.mig_instances.filter(state=MigInstanceState.ACTIVE)
            .select_related("profile")
            .order_by("placement_start")
        )


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


class MigInstance(models.Model):
    """A MIG GPU instance (with its compute instance) at a placement on a GPU."""

    gpu = models.ForeignKey(GpuCapacity, on_delete=models.PROTECT, related_name="mig_instances")
    profile = models.ForeignKey(MigProfile, on_delete=models.PROTECT, related_name="instances")
    placement = models.ForeignKey(MigPlacement, on_delete=models.PROTECT, related_name="instances")
    placement_start = models.PositiveSmallIntegerField()
    placement_size = models.PositiveSmallIntegerField()
    gi_id = models.PositiveSmallIntegerField(null=True, blank=True)
    ci_id = models.PositiveSmallIntegerField(null=True, blank=True)
    uuid = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=16, choices=MigInstanceState, default=MigInstanceState.ACTIVE)
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    gone_at = models.DateTimeField(null=True, blank=True)

    objects = MigInstanceQuerySet.as_manager()

    class Meta:
        ordering = ["gpu_id", "placement_start"]
        verbose_name = "MIG instance"
        constraints = [
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
        return f"{self.product} full GPU"


class WorkloadProfileQuerySet(models.QuerySet):
    def running(self):
        return self.filter(ended_at__isnull=True)


class WorkloadProfile(models.Model):
    """The seed's Profile: which pod runs on which GPU or MIG instance (workload tracking)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="workloads")
    namespace = models.CharField(max_length=63)
    pod_name = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    node = models.ForeignKey(NodeCapacity, null=True, blank=True, on_delete=models.PROTECT, related_name="workloads")
    gpu = models.ForeignKey(GpuCapacity, null=True, blank=True, on_delete=models.PROTECT, related_name="workloads")
    mig_instance = models.ForeignKey(
        MigInstance, null=True, blank=True, on_delete=models.PROTECT, related_name="workloads"
    )
    device_ids = models.JSONField(default=list, blank=True)
    resource_name = models.CharField(max_length=100)
    count = models.PositiveSmallIntegerField(default=1)
    project = models.ForeignKey(
        "pools.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="workloads"
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
        return f"{self.namespace}/{self.pod_name} ({self.resource_name})"
