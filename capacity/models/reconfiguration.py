"""MIG reconfigurations (one node's MIG change as a state machine) and their audit trail.

Services: capacity/services/reconfiguration.py; docs: docs/mig.md.
"""

from __future__ import annotations

from django.conf import settings as _settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from core.leases import LeasedQuerySet, LeasedStep

from ..choices import ReconfigurationBackend, ReconfigurationEvent, ReconfigurationState, ReconfigurationStep
from .clusters import Cluster
from .inventory import NodeCapacity
from .layouts import MigLayout


class MigReconfigurationQuerySet(LeasedQuerySet):
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
        return self.filter(state=ReconfigurationState.RUNNING).lease_ran_out(now, or_unset=True)


class NodeWorkflow(LeasedStep):
    """A workflow that holds one node while it runs (a MIG reconfiguration, a drain): the claim and who started
    it (LeasedStep), how it stands and whether the node was cordoned before. At most one open per node.
    """

    state = models.CharField(
        max_length=16, choices=ReconfigurationState, default=ReconfigurationState.PENDING, editable=False
    )
    was_cordoned = models.BooleanField(null=True, editable=False, help_text="Cordoned before we started.")

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(state__in=["pending", "running", "waiting", "failed"]),
                name="%(app_label)s_%(class)s_one_open_per_node",
            ),
        ]

    @property
    def is_open(self) -> bool:
        return self.state in MigReconfigurationQuerySet.OPEN_STATES


class WorkflowTrail(models.Model):
    """One row of a NodeWorkflow's audit trail: a step's event (started, completed, waiting, failed, ...)."""

    event = models.CharField(max_length=16, choices=ReconfigurationEvent)
    message = models.TextField(blank=True)
    detail = models.JSONField(default=dict, blank=True)
    task_id = models.CharField(max_length=64, blank=True)
    actor = models.ForeignKey(_settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


# Forcing a reconfiguration outside the node's maintenance windows (API, admin form, rebalance page).
FORCE_PERMISSION = "capacity.force_migreconfiguration"


class MigReconfiguration(NodeWorkflow):
    """One node's MIG change, as a state machine: plan, check, cordon, drain, apply, verify, uncordon.

    `step` is the step to run (or running); `state` says how it stands. Each step is claimed with a
    conditional UPDATE and is re-entrant, so a redelivered task carries on where a dead worker stopped.
    The claim's and the state's columns are NodeWorkflow's.
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
    config_written_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When config_name went into the mig-parted ConfigMap: the label waits MIG_PARTED_SYNC_S after it.",
    )
    agent_command = models.JSONField(
        default=dict, blank=True, editable=False, help_text="Agent backend: the signed NVML command last sent."
    )
    agent_command_sent_at = models.DateTimeField(null=True, blank=True, editable=False)
    agent_result = models.JSONField(
        default=dict, blank=True, editable=False, help_text="Agent backend: the node agent's signed result."
    )
    backend = models.CharField(max_length=16, choices=ReconfigurationBackend, default=ReconfigurationBackend.OPERATOR)
    drain = models.BooleanField(default=False, help_text="Evict GPU pods (allocated GPUs may be touched).")
    force = models.BooleanField(default=False, help_text="Run outside a maintenance window.")
    step = models.CharField(
        max_length=16, choices=ReconfigurationStep, default=ReconfigurationStep.PLAN, editable=False
    )
    lease_expires_at = models.DateTimeField(  # LeasedStep's, with its help text (as migrated)
        null=True,
        blank=True,
        editable=False,
        help_text="The running step's claim lapses then unless its worker renews it.",
    )
    planned_at = models.DateTimeField(null=True, blank=True, editable=False)
    checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    cordoned_at = models.DateTimeField(null=True, blank=True, editable=False)
    drained_at = models.DateTimeField(null=True, blank=True, editable=False)
    applied_at = models.DateTimeField(null=True, blank=True, editable=False)
    verified_at = models.DateTimeField(null=True, blank=True, editable=False)
    uncordoned_at = models.DateTimeField(null=True, blank=True, editable=False)
    failed_step = models.CharField(max_length=16, choices=ReconfigurationStep, blank=True, editable=False)
    rollback_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="rollbacks", editable=False
    )

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

    class Meta(NodeWorkflow.Meta):
        permissions = [("force_migreconfiguration", "Can force a MIG reconfiguration outside maintenance windows")]
        verbose_name = "MIG reconfiguration"
        indexes = [models.Index(fields=["state", "claimed_at"], name="capacity_migreconf_state_claim")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.node} -> {self.source or 'custom'} ({self.step}/{self.state})"

    @property
    def can_resume(self) -> bool:
        return self.state == ReconfigurationState.FAILED

    @property
    def can_roll_back(self) -> bool:
        return self.state == ReconfigurationState.FAILED and bool(self.previous)

    def target_for(self, index: int):
        return self.target.get(str(index), "unchanged")


class MigReconfigurationStep(WorkflowTrail):
    """Audit trail: one row per step event (started, completed, waiting, failed, resumed, ...)."""

    reconfiguration = models.ForeignKey(MigReconfiguration, on_delete=models.CASCADE, related_name="steps")
    step = models.CharField(max_length=16, choices=ReconfigurationStep)

    class Meta:
        ordering = ["reconfiguration_id", "at", "id"]
        verbose_name = "MIG reconfiguration step"

    def __str__(self) -> str:
        return f"#{self.reconfiguration_id} {self.step} {self.event}"
