"""GPU nodes and GPUs (the seed's NodeCapacity and GpuCapacity), with whole-GPU availability."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Count, Exists, F, OuterRef, Q, Subquery, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.celery import node_queue

from ..choices import (
    AgentHealth,
    Availability,
    GpuHealth,
    MigInstanceState,
    MigStrategy,
    SharingStrategy,
    SpecKind,
    Tier,
)
from ..vgpu import VGPU_CONFIG_LABEL, VGPU_CONFIG_STATE_LABEL, device_manager_document
from .availability import (
    USABLE_HEALTH,
    as_boolean,
    availability_case,
    fleet_forms,
    host_conditions,
)
from .clusters import Cluster
from .reservations import Allocation
from .workloads import WorkloadProfile


class NodeCapacityQuerySet(models.QuerySet):
    def present(self):
        return self.filter(gone_at__isnull=True)

    def nvml_polled(self):
        """Present GPU nodes whose metrics their node agent reads (clusters without a DCGM exporter), by pk."""
        return self.present().filter(gpu_count__gt=0, cluster__dcgm_exporter_url="").order_by("pk")

    def for_cluster(self, cluster):
        return self.filter(cluster=cluster)

    def record_agent_reports(self, versions: dict[int, str], at) -> None:
        """Stamp the nodes (pk -> the version their agent reported) as heard from at `at`: one UPDATE per
        distinct version, so one for a fleet on one release."""
        by_version: dict[str, list[int]] = {}
        for pk, version in versions.items():
            by_version.setdefault(version, []).append(pk)
        for version, pks in sorted(by_version.items()):
            self.filter(pk__in=sorted(pks)).update(agent_reported_at=at, agent_version=version)

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
    sharing_strategy = models.CharField(
        max_length=16, blank=True, help_text="nvidia.com/gpu.sharing-strategy: time-slicing, mps, or empty."
    )
    ready = models.BooleanField(default=False)
    cordoned = models.BooleanField(default=False)
    labels = models.JSONField(default=dict, blank=True)
    capacity = models.JSONField(default=dict, blank=True, help_text="Physical: status.capacity.")
    allocatable = models.JSONField(default=dict, blank=True, help_text="Logical: status.allocatable.")
    dra_devices = models.JSONField(
        default=dict,
        blank=True,
        help_text="DRA: device name -> GPU or MIG UUID, from the driver's ResourceSlice (empty: not under DRA).",
    )
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
    inventory_read_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When the node agent read the NVML inventory its GPU and MIG rows show (the agent's clock).",
    )
    # db_default: discovery inserts nodes with its own column list, which leaves this one out.
    pods_digest = models.CharField(
        max_length=32,
        blank=True,
        db_default="",
        editable=False,
        help_text="The kubelet's pod -> device set as the latest metrics poll fingerprinted it (PodResources List).",
    )
    inventory_error = models.CharField(
        max_length=500,
        blank=True,
        db_default="",
        editable=False,
        help_text="Why the agent's latest inventory read failed.",
    )

    # Stamped by the control plane from every accepted agent report (metrics or inventory); db_default for
    # discovery's own insert column list.
    agent_version = models.CharField(
        max_length=64, blank=True, db_default="", editable=False, help_text="The version its node agent reported."
    )
    agent_reported_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the control plane last accepted a report of its agent."
    )

    objects = NodeCapacityQuerySet.as_manager()

    # What the node's labels say of its GPUs and MIG (discovery writes them, the API shows them), in this order.
    LABELLED_FIELDS = ("gpu_memory_mib", "tier", "node_group", "mig_strategy", "mig_config", "mig_config_state")

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
        return node_queue(self.cluster.name, self.name)

    @property
    def vgpu_config(self) -> str:
        """The vGPU type the node's nvidia.com/vgpu.config label asks the vGPU device manager for ("" if none)."""
        return (self.labels or {}).get(VGPU_CONFIG_LABEL, "")

    @property
    def vgpu_config_state(self) -> str:
        """The device manager's progress on it (nvidia.com/vgpu.config.state): pending, success, failed or ""."""
        return (self.labels or {}).get(VGPU_CONFIG_STATE_LABEL, "")

    @property
    def is_gone(self) -> bool:
        return self.gone_at is not None

    def agent_health(self, now=None) -> str:
        """AgentHealth: never (no report accepted yet), stale (none within AGENT_STALE_AFTER_S), else ok."""
        if self.agent_reported_at is None:
            return AgentHealth.NEVER
        age = ((now or timezone.now()) - self.agent_reported_at).total_seconds()
        return AgentHealth.STALE if age > settings.AGENT_STALE_AFTER_S else AgentHealth.OK

    def inventory_read_since(self, moment) -> bool:
        """Whether the GPU and MIG rows show an NVML read made at or after `moment`. Reads are dated to the
        second by the agent (its report's slot), so a read in the same second counts."""
        return self.inventory_read_at is not None and self.inventory_read_at >= moment.replace(microsecond=0)


def configured_vgpu_q() -> Q:
    """SpecAndCount rows of kind vgpu whose type the node is configured for: its nvidia.com/vgpu.config label
    names that type's config in gpuaas's device manager document (one config per type, named after it:
    capacity.vgpu.device_manager_document), or names none gpuaas wrote (no label, an operator's own config:
    what the device plugin advertises stands). A type the plugin still advertises after the label moved on
    (the device manager is recreating the GPUs' vGPUs) is no offer: its vGPUs are going away; unless the device
    manager reported the change failed (nvidia.com/vgpu.config.state=failed): the old vGPUs stay."""
    names = sorted(device_manager_document()["vgpu-configs"])
    label = f"node__labels__{VGPU_CONFIG_LABEL}"
    return (
        ~Q(node__labels__has_key=VGPU_CONFIG_LABEL)
        | ~Q(**{f"{label}__in": names})
        | Q(profile_name=KeyTextTransform(VGPU_CONFIG_LABEL, "node__labels"))
        | Q(**{f"node__labels__{VGPU_CONFIG_STATE_LABEL}": "failed"})
    )


def vgpu_offers(node: str = "node"):
    """The vGPU offers (SpecAndCount rows of kind vgpu) of the node at OuterRef(`node`) that it is configured
    for (configured_vgpu_q)."""
    from .specs import SpecAndCount  # cycle: specs imports this module

    return SpecAndCount.objects.filter(configured_vgpu_q(), node=OuterRef(node), kind=SpecKind.VGPU)


def vgpu_node_q(vgpu_type: str = "", node: str = "node") -> Q:
    """GPUs (`node`: the path to their node) of nodes whose sandbox device plugin advertises vGPUs: of any
    type (a vm-vgpu node's GPUs are never whole-GPU hosts, configured or not), or offering `vgpu_type` as
    their configured type (vgpu_offers: what approval hands out and the tier plan counts)."""
    from .specs import SpecAndCount  # cycle: specs imports this module

    if vgpu_type:
        return Q(Exists(vgpu_offers(node).filter(profile_name=vgpu_type)))
    offers = SpecAndCount.objects.filter(node=OuterRef(node), kind=SpecKind.VGPU)
    return Q(Exists(offers))


class GpuCapacityQuerySet(models.QuerySet):
    def present(self):
        return self.filter(lost_at__isnull=True, node__gone_at__isnull=True)

    def healthy(self):
        return self.present().filter(health__in=USABLE_HEALTH)

    def for_cluster(self, cluster):
        return self.filter(node__cluster=cluster)

    def most_common_product(self) -> str | None:
        """The catalog product most of these GPUs are (a tie goes to the first name); None when none is known."""
        row = (
            self.exclude(catalog_product="")
            .values("catalog_product")
            .annotate(n=Count("pk"))
            .order_by("-n", "catalog_product")
            .first()
        )
        return row["catalog_product"] if row else None

    def usable(self):
        """Present GPUs that could host units now: healthy, on a ready, uncordoned node not mid MIG change."""
        return self.present().filter(*host_conditions().values())

    def units(self):
        """Present GPUs that are units themselves (MIG off); a MIG GPU's units are its MigInstances."""
        return self.present().filter(mig_mode_current=False)

    def _unit_conditions(self) -> dict[str, Q]:
        conditions = host_conditions()
        conditions[Availability.RECONFIGURING] &= Q(mig_mode_pending=False)  # MIG being switched on
        return conditions

    def _reserved(self) -> Exists:
        """An active allocation holds the GPU whole, or one of its time-slice replicas."""
        return Exists(Allocation.objects.active().filter(gpu=OuterRef("pk"), mig_instance__isnull=True))

    def _ending(self) -> Exists:
        """An ended allocation of the GPU (whole, or a replica) whose pods are not gone yet."""
        return Exists(Allocation.objects.ending().filter(gpu=OuterRef("pk"), mig_instance__isnull=True))

    def _in_use(self, busy_devices: frozenset[str] | None) -> Q:
        if busy_devices is None:
            busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
        in_use = Q(Exists(WorkloadProfile.objects.running().filter(gpu=OuterRef("pk"))))
        return in_use | Q(uuid__in=sorted(busy_devices)) if busy_devices else in_use

    def annotate_availability(
        self, busy_devices: frozenset[str] | None = None, *, fleet: bool = False, within: dict | None = None
    ):
        """`availability` (choices.Availability) of each GPU as a whole-GPU unit, and `reserved` (held).

        Meaningful for GPUs with MIG off (units()); a MIG GPU's units are its instances. `reserved` is
        true whenever an active allocation holds the unit, also when it is in use.
        `busy_devices`: WorkloadProfile.objects.running().multi_device_uuids(), when the caller has it.
        `fleet`: for a count over every GPU (the dashboard), the same availability with hashed subqueries
        (availability.fleet_forms) instead of a probe per row; `within` (fleet only): lookups that narrow the
        GPUs and the holders those subqueries read (`{"pk__in": ids}`, `{"node__cluster_id__in": ids}`).
        """
        if fleet:
            if busy_devices is None:
                busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
            running = WorkloadProfile.objects.running()
            reserved, in_use, ending = fleet_forms(self.model, "gpu", running, busy_devices, within)
            availability = availability_case(self._unit_conditions(), reserved, in_use, ending)
            gpus = self.filter(**(within or {}))
            return gpus.annotate(availability=availability, reserved=as_boolean(reserved))
        reserved = self._reserved()
        availability = availability_case(self._unit_conditions(), reserved, self._in_use(busy_devices), self._ending())
        return self.annotate(availability=availability, reserved=reserved)

    def free(self, busy_devices: frozenset[str] | None = None, *, fleet: bool = False):
        """Whole GPUs approval may take: availability FREE, as plain filters.

        `fleet`: for a count over every free GPU of a spec (approval's read_free), the same rows with hashed
        subqueries (availability.fleet_forms) instead of a probe per GPU."""
        if fleet:
            if busy_devices is None:
                busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
            held = fleet_forms(self.model, "gpu", WorkloadProfile.objects.running(), busy_devices)
            return self.units().filter(*self._unit_conditions().values(), *(~q for q in held))
        return self.units().filter(
            *self._unit_conditions().values(), ~self._reserved(), ~self._ending(), ~self._in_use(busy_devices)
        )

    def with_free_replicas(self):
        """Time-sliced GPUs with a replica no active allocation holds, annotated `free` (replicas not held).

        Replicas are handed out by count, so running workloads do not withhold one: which replica a
        pod uses is not known.
        """
        return self.timeslice_hosts().with_free_shares()

    # --- Which GPUs each kind of unit is drawn from: approval (pools/units/) and the tier plan
    # (capacity/services/planning.py) both filter with these, so the plan counts what approval gives out.

    def whole_gpu_hosts(self):
        """GPUs handed out whole: MIG off, on training or untiered nodes without time-slicing, not vm-vgpu
        nodes (their GPUs are carved into vGPUs). Whole GPUs of other tiers are never given out."""
        return (
            self.units()
            .filter(node__tier__in=[Tier.TRAINING, Tier.NONE], node__timeslice_replicas__lte=1)
            .exclude(vgpu_node_q())
        )

    def timeslice_hosts(self, *, mps: bool | None = None):
        """GPUs whose node's device plugin shares them as replicas: MPS nodes only (`mps=True`), others
        only (`mps=False`), or both."""
        queryset = self.filter(node__timeslice_replicas__gt=1)
        if mps is True:
            return queryset.filter(node__sharing_strategy=SharingStrategy.MPS)
        if mps is False:
            return queryset.exclude(node__sharing_strategy=SharingStrategy.MPS)
        return queryset

    def vgpu_hosts(self, vgpu_type: str = ""):
        """GPUs of nodes whose sandbox device plugin advertises vGPUs (of `vgpu_type`, or of any type)."""
        return self.filter(vgpu_node_q(vgpu_type))

    def annotate_shares(self, per_gpu: int | None = None):
        """`shares` (the node's time-slice replicas, or `per_gpu`, the vGPUs per GPU of a vGPU type) and
        `held` (shares an active or ending allocation holds: an ending replica's pods run until the ending
        sweep evicts them) of each GPU."""
        held = (
            Allocation.objects.holding()
            .filter(gpu=OuterRef("pk"), mig_instance__isnull=True)
            .order_by()
            .values("gpu")
            .annotate(n=Count("pk"))
            .values("n")
        )
        shares = F("node__timeslice_replicas") if per_gpu is None else Value(per_gpu)
        return self.annotate(shares=shares, held=Coalesce(Subquery(held), 0))

    def share_conditions(self) -> list[Q]:
        """What a shared GPU must satisfy for its shares to be given out (the unit conditions)."""
        return list(self._unit_conditions().values())

    def with_free_shares(self, per_gpu: int | None = None):
        """GPUs with a share no active allocation holds, annotated `free`: time-slice replicas (the node's
        replica count), or `per_gpu` shares each (the vGPUs per GPU of a vGPU type)."""
        return (
            self.units()
            .filter(*self.share_conditions())
            .annotate_shares(per_gpu)
            .annotate(free=F("shares") - F("held"))
            .filter(free__gt=0)
        )


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
    nvlink_group = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="GPUs of a node joined by NVLink share this (lowest index); empty: none."
    )
    pcie_group = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="GPUs of a node below one PCIe host bridge share this (lowest index)."
    )
    numa_group = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="GPUs of a node on one NUMA node share this (lowest index)."
    )
    last_seen_at = models.DateTimeField(default=timezone.now)
    lost_at = models.DateTimeField(null=True, blank=True)

    objects = GpuCapacityQuerySet.as_manager()

    # What the node's NVML (the agent's inventory report) says of the GPU: ingest writes them, the API shows them.
    REPORTED_FIELDS = (
        "product",
        "catalog_product",
        "memory_mib",
        "mig_mode_current",
        "mig_mode_pending",
        "health",
        "driver_version",
        "cuda_version",
        "serial",
        "pci_bus_id",
    )

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
