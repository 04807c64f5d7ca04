"""Monitoring's events: health events, idle reservations, share violations, trespass events, and the memory
an idle unit reads in use (which trespass detection discounts)."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from tenancy.roles import in_projects_of, sees_all_projects

from ..choices import HealthLevel, HealthRule, IdleProposal, IdleState, MetricSource, ShareState, TrespassKind
from .series import _allocations_of


class HealthEventQuerySet(models.QuerySet):
    def open(self):
        return self.filter(resolved_at__isnull=True)

    def critical(self):
        return self.filter(level=HealthLevel.CRITICAL)

    def visible_to(self, user):
        """Events a user may see: operators all; a project sees events on the units it held while they were open.

        A GPU-level event (no MIG instance) concerns every project holding any unit on that GPU; a
        MIG-level event only the project holding that instance. One EXISTS subquery, no JOIN fan-out.
        """
        if sees_all_projects(user):
            return self
        overlapping = _allocations_of(user).filter(
            Q(released_at__isnull=True) | Q(released_at__gte=OuterRef("opened_at")),
            allocated_at__lte=OuterRef("last_seen_at"),
        )
        gpu_level = overlapping.filter(gpu_id=OuterRef("gpu_id"))
        mig_level = overlapping.filter(mig_instance_id=OuterRef("mig_instance_id"))
        return self.alias(_gpu_held=Exists(gpu_level), _mig_held=Exists(mig_level)).filter(
            Q(mig_instance__isnull=True, _gpu_held=True) | Q(mig_instance__isnull=False, _mig_held=True)
        )


class HealthEvent(models.Model):
    """A health problem of a GPU or MIG instance: which unit, which rule, since when, until when.

    At most one open event per (gpu, mig_instance, rule): repeated observations bump `last_seen_at`
    and `occurrences` on the open row. Resolution sets `resolved_at`; a later recurrence opens a new row.
    """

    gpu = models.ForeignKey("capacity.GpuCapacity", on_delete=models.CASCADE, related_name="health_events")
    mig_instance = models.ForeignKey(
        "capacity.MigInstance", null=True, blank=True, on_delete=models.CASCADE, related_name="health_events"
    )
    rule = models.CharField(max_length=24, choices=HealthRule)
    level = models.CharField(max_length=10, choices=HealthLevel)
    source = models.CharField(max_length=8, choices=MetricSource, default=MetricSource.NVML)
    value = models.BigIntegerField(null=True, blank=True, help_text="Rule-specific: XID code, error count...")
    message = models.CharField(max_length=300, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    occurrences = models.PositiveIntegerField(default=1)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolution = models.CharField(max_length=200, blank=True)

    objects = HealthEventQuerySet.as_manager()

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "rule"],
                condition=Q(resolved_at__isnull=True, mig_instance__isnull=True),
                name="monitoring_healthevent_unique_open_gpu_rule",
            ),
            models.UniqueConstraint(
                fields=["mig_instance", "rule"],
                condition=Q(resolved_at__isnull=True, mig_instance__isnull=False),
                name="monitoring_healthevent_unique_open_mig_rule",
            ),
        ]
        indexes = [
            models.Index(fields=["gpu", "resolved_at"], name="monitoring_health_gpu_open"),
            models.Index(fields=["-opened_at"], name="monitoring_health_recent"),
        ]

    def __str__(self) -> str:
        unit = f" MIG {self.mig_instance_id}" if self.mig_instance_id else ""
        return f"{self.get_level_display()} {self.get_rule_display()} on GPU {self.gpu_id}{unit}"

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


class IdleReservationQuerySet(models.QuerySet):
    def open(self):
        return self.filter(state=IdleState.OPEN)

    def visible_to(self, user):
        if sees_all_projects(user):
            return self
        return self.filter(in_projects_of(user, "allocation__project_id"))


class IdleReservation(models.Model):
    """An active allocation whose partition stayed idle over the window, with a release/downsize proposal."""

    allocation = models.ForeignKey("capacity.Allocation", on_delete=models.CASCADE, related_name="idle_flags")
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    sm_active_avg = models.FloatField(help_text="Average SM activity over the window, percent.")
    sm_active_max = models.FloatField(null=True, blank=True)
    mem_used_max_mib = models.IntegerField(null=True, blank=True)
    coverage = models.FloatField(help_text="Share of the window covered by samples (0-1).")
    proposal = models.CharField(max_length=10, choices=IdleProposal)
    suggested_profile = models.CharField(max_length=32, blank=True)
    state = models.CharField(max_length=10, choices=IdleState, default=IdleState.OPEN, editable=False)
    detected_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = IdleReservationQuerySet.as_manager()

    class Meta:
        ordering = ["-detected_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["allocation"], condition=Q(state="open"), name="monitoring_idlereservation_unique_open"
            ),
        ]
        indexes = [models.Index(fields=["state", "-detected_at"], name="monitoring_idle_state")]

    def __str__(self) -> str:
        return f"allocation {self.allocation_id}: {self.sm_active_avg:.1f}% SM -> {self.proposal}"


class ShareViolation(models.Model):
    """A pod on a time-sliced GPU using far more memory or compute than its share (1 / replicas x factor).

    Open until the pod is back within its share or gone (resolved_at); meanwhile it may be evicted
    (MONITORING_EVICT_OVER_SHARE). One unresolved row per (gpu, pod).
    """

    gpu = models.ForeignKey("capacity.GpuCapacity", on_delete=models.CASCADE, related_name="share_violations")
    workload = models.ForeignKey(
        "capacity.WorkloadProfile", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    project = models.ForeignKey("tenancy.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    namespace = models.CharField(max_length=63)
    pod_name = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    used_mib = models.PositiveIntegerField()
    share_mib = models.PositiveIntegerField()
    replicas = models.PositiveSmallIntegerField()
    sm_util_pct = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The pod's SM utilisation (per-process NVML); empty = not measured."
    )
    over = models.CharField(
        max_length=16, default="memory", help_text="What the pod is over its share of: memory, compute, or both."
    )
    share_priority = models.CharField(
        max_length=8,
        blank=True,
        help_text="The share priority of the pod's pool on this GPU (high, normal, low; empty: no pool). Lower "
        "priorities are evicted first.",
    )
    state = models.CharField(max_length=16, choices=ShareState, default=ShareState.OPEN, editable=False)
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    evicted_at = models.DateTimeField(null=True, blank=True)
    eviction_attempted_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-first_seen_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "pod_uid"],
                condition=Q(resolved_at__isnull=True),
                name="monitoring_shareviolation_unique_open",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod_name}: {self.used_mib} MiB > share {self.share_mib} MiB"


# What a project member reads for any project but its own: never its slug, namespace, pod or user.
ANOTHER_PROJECT = "another project"


@dataclass(frozen=True, slots=True)
class TrespassSides:
    """Who a trespass event names, as one viewer may read it (TrespassEvent.as_seen_by)."""

    owner: str | None  # the holder's slug, ANOTHER_PROJECT, or None: unallocated
    project: str | None  # the offender's slug, ANOTHER_PROJECT, or None: no pod known (activity only)
    namespace: str | None  # None: no pod, or not the viewer's to know
    pod_name: str | None


class TrespassEventQuerySet(models.QuerySet):
    def open(self):
        return self.filter(ended_at__isnull=True)

    def visible_to(self, user):
        """Operators see every event; a project member sees those on its own units and those by its own pods."""
        if sees_all_projects(user):
            return self
        # One index scan per column (owner_project, project), then a BitmapOr.
        return self.filter(Q(in_projects_of(user, "owner_project_id")) | Q(in_projects_of(user, "project_id")))


class TrespassEvent(models.Model):
    """A unit used by someone it does not belong to: a pod on another project's unit, a pod on an unallocated
    unit, or activity (SM over MONITORING_TRESPASS_SM_PCT or memory in use) on an unallocated unit.

    Opened by the trespass check (monitoring/services/trespass.py) the first poll it is seen, kept open
    (last_seen_at) while it lasts, ended the first poll it is not. One open row per (unit, kind, pod).
    The trespasser's project is charged the unit's list rate for started_at..ended_at (billing); the
    owner is not billed "used" for that time.
    """

    kind = models.CharField(max_length=24, choices=TrespassKind)
    gpu = models.ForeignKey("capacity.GpuCapacity", on_delete=models.CASCADE, related_name="trespass_events")
    mig_instance = models.ForeignKey(
        "capacity.MigInstance", null=True, blank=True, on_delete=models.CASCADE, related_name="trespass_events"
    )
    unit_key = models.CharField(max_length=40, editable=False, help_text="gpu:<id> or mig:<id>: one open row per unit.")
    owner_project = models.ForeignKey(
        "tenancy.Project",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="trespassed_on",
        help_text="The project holding the unit (empty: unallocated).",
    )
    project = models.ForeignKey(
        "tenancy.Project",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="trespasses",
        help_text="The offending project, when known (the pod's namespace is a project's).",
    )
    workload = models.ForeignKey(
        "capacity.WorkloadProfile", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    namespace = models.CharField(max_length=63, blank=True)
    pod_name = models.CharField(max_length=253, blank=True)
    pod_uid = models.CharField(max_length=64, blank=True)
    sm_active = models.FloatField(null=True, blank=True, help_text="Activity kind: SM percent when opened.")
    mem_used_mib = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    eviction_attempted_at = models.DateTimeField(null=True, blank=True)
    evicted_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    objects = TrespassEventQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["unit_key", "kind", "pod_uid"],
                condition=Q(ended_at__isnull=True),
                name="monitoring_trespass_unique_open",
            ),
        ]
        indexes = [
            models.Index(fields=["ended_at", "-started_at"], name="monitoring_trespass_open"),
            models.Index(fields=["project", "started_at"], name="monitoring_trespass_project"),
            # The admin's list (Meta.ordering) pages newest first: without it every page sorts every event.
            models.Index(fields=["-started_at", "-id"], name="monitoring_trespass_recent"),
        ]

    def __str__(self) -> str:
        who = f"{self.namespace}/{self.pod_name}" if self.pod_name else "unknown process"
        return f"{self.get_kind_display()}: {who} on {self.unit_key}"

    @property
    def is_open(self) -> bool:
        return self.ended_at is None

    def as_seen_by(self, visible_project_ids: set[int] | frozenset[int] | None) -> TrespassSides:
        """The two sides of the event as a viewer who sees `visible_project_ids` reads them (None: an operator,
        who sees everything). A member reads "another project" for any other side and nothing that names it:
        the pod's namespace and name only when the pod is one of its own projects'."""
        if visible_project_ids is None:
            return TrespassSides(
                owner=self.owner_project.slug if self.owner_project_id else None,
                project=self.project.slug if self.project_id else None,
                namespace=self.namespace,
                pod_name=self.pod_name,
            )
        owner = None
        if self.owner_project_id:
            owner = self.owner_project.slug if self.owner_project_id in visible_project_ids else ANOTHER_PROJECT
        if self.project_id is not None and self.project_id in visible_project_ids:
            return TrespassSides(owner, self.project.slug, self.namespace, self.pod_name)
        someone = self.project_id is not None or bool(self.pod_name or self.namespace)
        return TrespassSides(owner, ANOTHER_PROJECT if someone else None, None, None)

    @property
    def state(self) -> str:
        return "open" if self.ended_at is None else "closed"


class IdleMemory(models.Model):
    """The memory an idle unit of one product and MIG profile reads in use: the driver's own reservation.

    Learned from NVML polls (services/idle_memory.py): a unit whose process list is empty holds only what
    the driver reserves, so its reading is recorded per (product, profile; "" for a whole GPU). Trespass
    detection discounts it before calling memory "in use" on an unallocated unit.
    """

    product = models.CharField(max_length=64)
    profile_name = models.CharField(max_length=32, blank=True)
    mem_used_mib = models.IntegerField()
    learned_at = models.DateTimeField()

    class Meta:
        ordering = ["product", "profile_name"]
        constraints = [
            models.UniqueConstraint(fields=["product", "profile_name"], name="monitoring_idlememory_unique_unit_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.product} {self.profile_name or 'whole GPU'}: {self.mem_used_mib} MiB idle"
