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
    fingerprint = models.CharField(
        max_length=32,
        blank=True,
        editable=False,
        help_text="Hash of what discovery read from the node; an equal hash means nothing to write.",
    )
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now, help_text="When discovery last wrote the row.")
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
    # Unique through Meta.constraints, not unique=True: PostgreSQL then builds no extra LIKE index,
    # which discovery would maintain for every one of tens of thousands of rows.
    uuid = models.CharField(max_length=64)
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
            models.UniqueConstraint(fields=["uuid"], name="capacity_gpucapacity_unique_uuid"),
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
        return f"{self.namespace}/{self.pod_name} ({self.resource_name})"


# =================================================================================================
# MIG reconfiguration, maintenance windows and time-slicing.
# Services: capacity/reconfiguration.py; docs: docs/mig.md. Appended here so the discovery models
# above stay untouched; imports are local to this section.
# =================================================================================================

import datetime as _dt  # noqa: E402

from django.conf import settings as _settings  # noqa: E402
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator  # noqa: E402

from .choices import (  # noqa: E402
    ReconfigurationBackend,
    ReconfigurationEvent,
    ReconfigurationState,
    ReconfigurationStep,
)

# gpuaas-owned mig-parted configs and device-plugin keys carry this prefix; nothing else is touched.
GPUAAS_CONFIG_PREFIX = "gpuaas-"

_layout_name = RegexValidator(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "Lower-case letters, digits, '-' and '.' (it becomes a label value)."
)


class MigLayout(models.Model):
    """A custom MIG layout for one product, written into gpuaas's mig-parted ConfigMap as `gpuaas-<name>`.

    `gpus` is either {"all": [profiles]} (one layout for every GPU) or {"<index>": [profiles], ...}
    (only the listed GPUs change). A list of profiles means MIG on with those instances ([] = MIG on,
    no instances); null means MIG off.
    """

    name = models.CharField(max_length=50, unique=True, validators=[_layout_name])
    product = models.CharField(max_length=32, help_text="MIG catalog key, e.g. H100-80GB.")
    gpus = models.JSONField(
        default=dict,
        help_text='{"all": ["3g.40gb", "3g.40gb"]} or {"0": ["7g.80gb"], "1": ["1g.10gb", "1g.10gb"]}; null = MIG off.',
    )
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["product", "name"]
        verbose_name = "MIG layout"

    def __str__(self) -> str:
        return f"{self.name} ({self.product})"

    @property
    def config_name(self) -> str:
        """The mig-parted config name, i.e. the value of the node label nvidia.com/mig.config."""
        return GPUAAS_CONFIG_PREFIX + self.name

    def targets_for(self, gpu_indices) -> dict[int, list[str] | None]:
        """Target profiles per GPU index of a node with `gpu_indices`; GPUs not covered are left out."""
        if "all" in self.gpus:
            return {int(i): _copy_profiles(self.gpus["all"]) for i in gpu_indices}
        wanted = {int(k): _copy_profiles(v) for k, v in self.gpus.items()}
        return {i: wanted[i] for i in gpu_indices if i in wanted}

    def clean(self) -> None:
        from .mig.catalog import get_product
        from .mig.layout import validate_layout

        try:
            product = get_product(self.product)
        except KeyError as exc:
            raise ValidationError({"product": exc.args[0]}) from None
        self.product = product.key
        if not isinstance(self.gpus, dict) or not self.gpus:
            raise ValidationError({"gpus": 'Give {"all": [...]} or per-GPU lists like {"0": [...]}.'})
        keys = set(self.gpus)
        if "all" in keys and len(keys) > 1:
            raise ValidationError({"gpus": '"all" cannot be combined with per-GPU entries.'})
        errors = []
        for key, profiles in sorted(self.gpus.items()):
            if key != "all" and not (isinstance(key, str) and key.isdigit() and int(key) < 64):
                errors.append(f"{key!r} is not a GPU index")
                continue
            if profiles is None:
                continue
            if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
                errors.append(f"GPU {key}: give a list of profile names or null")
                continue
            result = validate_layout(product, profiles)
            if not result.valid:
                errors.append(f"GPU {key}: {result.reason}")
        if errors:
            raise ValidationError({"gpus": errors})


def _copy_profiles(value):
    return None if value is None else list(value)


class MaintenanceWindowQuerySet(models.QuerySet):
    def enabled(self):
        return self.filter(enabled=True)

    def for_node(self, node):
        """Windows that apply to `node`: its cluster's windows for every group or for the node's group."""
        scope = Q(node_group="") | Q(node_group=node.node_group)
        return self.enabled().filter(cluster_id=node.cluster_id).filter(scope)

    def open_at(self, at=None) -> list:
        at = at or timezone.now()
        return [w for w in self if w.is_open(at)]


class MaintenanceWindow(models.Model):
    """When nodes of a cluster (or of one node group) may be disrupted, in UTC.

    Weekly (weekday + start/end time; an end before the start runs past midnight) or one-off
    (starts_at/ends_at). MIG reconfigurations run only inside an open window unless forced.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="maintenance_windows")
    node_group = models.CharField(max_length=100, blank=True, help_text="Empty = every node of the cluster.")
    name = models.CharField(max_length=100, blank=True)
    weekday = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(6)], help_text="0 = Monday … 6 = Sunday (weekly)."
    )
    start_time = models.TimeField(null=True, blank=True, help_text="Weekly: opens at (UTC).")
    end_time = models.TimeField(null=True, blank=True, help_text="Weekly: closes at (UTC); before start = next day.")
    starts_at = models.DateTimeField(null=True, blank=True, help_text="One-off: opens at.")
    ends_at = models.DateTimeField(null=True, blank=True, help_text="One-off: closes at.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = MaintenanceWindowQuerySet.as_manager()

    class Meta:
        ordering = ["cluster_id", "node_group", "weekday", "start_time", "starts_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(
                        weekday__isnull=False,
                        start_time__isnull=False,
                        end_time__isnull=False,
                        starts_at__isnull=True,
                        ends_at__isnull=True,
                    )
                    | Q(
                        weekday__isnull=True,
                        start_time__isnull=True,
                        end_time__isnull=True,
                        starts_at__isnull=False,
                        ends_at__isnull=False,
                        ends_at__gt=models.F("starts_at"),
                    )
                ),
                name="capacity_maintenancewindow_weekly_or_oneoff",
            ),
        ]

    def __str__(self) -> str:
        scope = f"{self.cluster}/{self.node_group}" if self.node_group else str(self.cluster)
        return f"{scope}: {self.schedule_label}"

    @property
    def is_weekly(self) -> bool:
        return self.weekday is not None

    @property
    def schedule_label(self) -> str:
        if self.is_weekly:
            day = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"][self.weekday]
            return f"weekly {day} {self.start_time:%H:%M}-{self.end_time:%H:%M} UTC"
        return f"{self.starts_at:%Y-%m-%d %H:%M} - {self.ends_at:%Y-%m-%d %H:%M} UTC"

    def clean(self) -> None:
        weekly = [self.weekday, self.start_time, self.end_time]
        oneoff = [self.starts_at, self.ends_at]
        if any(v is not None for v in weekly) and any(v is not None for v in oneoff):
            raise ValidationError("Give either a weekly window (weekday, start, end) or a one-off one, not both.")
        if any(v is not None for v in weekly):
            if any(v is None for v in weekly):
                raise ValidationError({"weekday": "A weekly window needs a weekday, a start time and an end time."})
            if self.start_time == self.end_time:
                raise ValidationError({"end_time": "The window must not be empty."})
        elif all(v is not None for v in oneoff):
            if self.ends_at <= self.starts_at:
                raise ValidationError({"ends_at": "The end must be after the start."})
        else:
            raise ValidationError("Give a weekly window (weekday, start, end) or a one-off one (start and end).")

    def occurrences(self, around: _dt.datetime):
        """(opens, closes) intervals near `around` (the week before and after, for weekly windows)."""
        if not self.is_weekly:
            return [(self.starts_at, self.ends_at)]
        utc = around.astimezone(_dt.UTC)
        monday = (utc - _dt.timedelta(days=utc.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
        out = []
        for week in (-1, 0, 1):
            day = monday + _dt.timedelta(days=7 * week + self.weekday)
            opens = day.replace(hour=self.start_time.hour, minute=self.start_time.minute, second=self.start_time.second)
            closes = day.replace(hour=self.end_time.hour, minute=self.end_time.minute, second=self.end_time.second)
            if closes <= opens:
                closes += _dt.timedelta(days=1)
            out.append((opens, closes))
        return out

    def is_open(self, at: _dt.datetime | None = None) -> bool:
        at = at or timezone.now()
        return any(opens <= at < closes for opens, closes in self.occurrences(at))

    def next_opening(self, after: _dt.datetime | None = None) -> tuple[_dt.datetime, _dt.datetime] | None:
        """The (opens, closes) interval that is open at `after` or opens next; None if none is left."""
        after = after or timezone.now()
        for opens, closes in self.occurrences(after):
            if closes > after:
                return opens, closes
        return None


class TimeSlicingPolicy(models.Model):
    """Time-slicing for a node group: every GPU advertised as `replicas` nvidia.com/gpu (tier-3 slots).

    Written into the device plugin's ConfigMap (key `config_key`) and selected by the node label
    nvidia.com/device-plugin.config. Time-slicing has NO memory isolation: replicas share the GPU's memory.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="time_slicing_policies")
    node_group = models.CharField(max_length=100, blank=True, help_text="Empty = every node of the cluster.")
    replicas = models.PositiveSmallIntegerField(
        default=4, validators=[MinValueValidator(2), MaxValueValidator(64)], help_text="Pods per GPU, e.g. 4."
    )
    rename_by_default = models.BooleanField(
        default=False, help_text="Advertise nvidia.com/gpu.shared instead of nvidia.com/gpu."
    )
    fail_requests_greater_than_one = models.BooleanField(default=True)
    enabled = models.BooleanField(default=True)
    applied_at = models.DateTimeField(null=True, blank=True, editable=False)
    nodes_labelled = models.PositiveIntegerField(default=0, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster_id", "node_group"]
        verbose_name = "time-slicing policy"
        verbose_name_plural = "time-slicing policies"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "node_group"], name="capacity_timeslicingpolicy_unique_group"),
            models.CheckConstraint(condition=Q(replicas__gte=2), name="capacity_timeslicingpolicy_replicas_gte_2"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.node_group or '*'}: {self.replicas}x time-slicing"

    @property
    def config_key(self) -> str:
        """Key in the device-plugin ConfigMap; the replica count is in the name so a change relabels nodes."""
        group = self.node_group or "all"
        safe = "".join(c if c.isalnum() or c in "-." else "-" for c in group.lower()).strip("-.") or "group"
        return f"{GPUAAS_CONFIG_PREFIX}{safe}-x{self.replicas}"


class MigReconfigurationQuerySet(models.QuerySet):
    OPEN_STATES = (
        ReconfigurationState.PENDING,
        ReconfigurationState.RUNNING,
        ReconfigurationState.WAITING,
        ReconfigurationState.FAILED,
    )

    def open(self):
        """Reconfigurations that still hold their node (failed ones too: the node stays cordoned)."""
        return self.filter(state__in=self.OPEN_STATES)

    def stale(self, now):
        """Running steps whose claim's lease ran out by `now`: their worker died (no heartbeat)."""
        return self.filter(state=ReconfigurationState.RUNNING).filter(
            models.Q(lease_expires_at__lt=now) | models.Q(lease_expires_at__isnull=True)
        )


# Forcing a reconfiguration outside the node's maintenance windows (API, admin form, rebalance page).
FORCE_PERMISSION = "capacity.force_migreconfiguration"


class MigReconfiguration(models.Model):
    """One node's MIG change, as a state machine: plan, check, cordon, drain, apply, verify, uncordon.

    `step` is the step to run (or running); `state` says how it stands. Each step is claimed with a
    conditional UPDATE and is re-entrant, so a redelivered task carries on where a dead worker stopped.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="mig_reconfigurations")
    node = models.ForeignKey(NodeCapacity, on_delete=models.PROTECT, related_name="mig_reconfigurations")
    layout = models.ForeignKey(
        MigLayout, null=True, blank=True, on_delete=models.SET_NULL, related_name="reconfigurations"
    )
    source = models.CharField(
        max_length=100, blank=True, help_text="What was asked: a named config, gpuaas-<layout> or 'custom'."
    )
    target = models.JSONField(help_text='Profiles per GPU index: {"0": ["3g.40gb", "3g.40gb"], "1": null (MIG off)}.')
    plan = models.JSONField(default=dict, blank=True, editable=False)
    previous = models.JSONField(default=dict, blank=True, editable=False, help_text="Layout before: for roll-back.")
    config_name = models.CharField(max_length=100, blank=True, editable=False, help_text="nvidia.com/mig.config set.")
    backend = models.CharField(max_length=16, choices=ReconfigurationBackend, default=ReconfigurationBackend.OPERATOR)
    drain = models.BooleanField(default=False, help_text="Evict GPU pods (allocated GPUs may be touched).")
    force = models.BooleanField(default=False, help_text="Run outside a maintenance window.")
    step = models.CharField(
        max_length=16, choices=ReconfigurationStep, default=ReconfigurationStep.PLAN, editable=False
    )
    state = models.CharField(
        max_length=16, choices=ReconfigurationState, default=ReconfigurationState.PENDING, editable=False
    )
    claim_token = models.CharField(max_length=64, blank=True, editable=False)
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="The running step's claim lapses then unless its worker renews it.",
    )
    step_deadline = models.DateTimeField(null=True, blank=True, editable=False)
    was_cordoned = models.BooleanField(null=True, editable=False, help_text="Cordoned before we started.")
    planned_at = models.DateTimeField(null=True, blank=True, editable=False)
    checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    cordoned_at = models.DateTimeField(null=True, blank=True, editable=False)
    drained_at = models.DateTimeField(null=True, blank=True, editable=False)
    applied_at = models.DateTimeField(null=True, blank=True, editable=False)
    verified_at = models.DateTimeField(null=True, blank=True, editable=False)
    uncordoned_at = models.DateTimeField(null=True, blank=True, editable=False)
    finished_at = models.DateTimeField(null=True, blank=True, editable=False)
    failed_step = models.CharField(max_length=16, choices=ReconfigurationStep, blank=True, editable=False)
    error = models.TextField(blank=True, editable=False)
    task_id = models.CharField(max_length=64, blank=True, editable=False)
    attempts = models.PositiveSmallIntegerField(default=0, editable=False, help_text="Resumes so far.")
    rollback_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="rollbacks", editable=False
    )
    created_by = models.ForeignKey(
        _settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = MigReconfigurationQuerySet.as_manager()

    # step -> the timestamp field it sets when it completes
    STEP_TIMESTAMPS = {
        ReconfigurationStep.PLAN: "planned_at",
        ReconfigurationStep.CHECK: "checked_at",
        ReconfigurationStep.CORDON: "cordoned_at",
        ReconfigurationStep.DRAIN: "drained_at",
        ReconfigurationStep.APPLY: "applied_at",
        ReconfigurationStep.VERIFY: "verified_at",
        ReconfigurationStep.UNCORDON: "uncordoned_at",
    }

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("force_migreconfiguration", "Can force a MIG reconfiguration outside maintenance windows")]
        verbose_name = "MIG reconfiguration"
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(state__in=["pending", "running", "waiting", "failed"]),
                name="capacity_migreconfiguration_one_open_per_node",
            ),
        ]
        indexes = [models.Index(fields=["state", "claimed_at"], name="capacity_migreconf_state_claim")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.node} -> {self.source or 'custom'} ({self.step}/{self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in MigReconfigurationQuerySet.OPEN_STATES

    @property
    def can_resume(self) -> bool:
        return self.state == ReconfigurationState.FAILED

    @property
    def can_roll_back(self) -> bool:
        return self.state == ReconfigurationState.FAILED and bool(self.previous)

    def target_for(self, index: int):
        return self.target.get(str(index), "unchanged")


class MigReconfigurationStep(models.Model):
    """Audit trail: one row per step event (started, completed, waiting, failed, resumed, ...)."""

    reconfiguration = models.ForeignKey(MigReconfiguration, on_delete=models.CASCADE, related_name="steps")
    step = models.CharField(max_length=16, choices=ReconfigurationStep)
    event = models.CharField(max_length=16, choices=ReconfigurationEvent)
    message = models.TextField(blank=True)
    detail = models.JSONField(default=dict, blank=True)
    task_id = models.CharField(max_length=64, blank=True)
    actor = models.ForeignKey(_settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["reconfiguration_id", "at", "id"]
        verbose_name = "MIG reconfiguration step"

    def __str__(self) -> str:
        return f"#{self.reconfiguration_id} {self.step} {self.event}"
