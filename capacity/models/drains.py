"""Drain-and-move: one node taken offline for maintenance with its reservations moved first, and its trail.

The workflow runs on the reconfiguration engine (operations/reconfiguration/engine.py) with its own
steps (operations/maintenance); docs: docs/maintenance.md.
"""

from __future__ import annotations

from django.db import models

from ..choices import DrainStep, ReconfigurationState
from .clusters import Cluster
from .inventory import NodeCapacity
from .reconfiguration import MigReconfigurationQuerySet, NodeWorkflow, WorkflowTrail


class NodeDrainQuerySet(MigReconfigurationQuerySet):
    """open() and stale() as for reconfigurations: the same states, the same leases."""


class NodeDrain(NodeWorkflow):
    """A node going offline: check the reserve, notify, cordon, move each reservation, evict after the
    grace, hand the node over, and uncordon it when it is given back healthy.

    `step` is the step to run (or running); `state` says how it stands (the reconfiguration's states).
    `moves` lists what the move step did: {"allocation", "project", "from", "to"} per reservation.
    The claim's and the state's columns are NodeWorkflow's.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="node_drains")
    node = models.ForeignKey(NodeCapacity, on_delete=models.PROTECT, related_name="drains")
    reason = models.CharField(max_length=200, blank=True, help_text="Shown to the projects: driver update, ...")
    grace_s = models.PositiveIntegerField(default=3600, help_text="Notice given before the moved pods are evicted.")
    driver_upgrade = models.BooleanField(
        default=False,
        help_text="Hand the node to the GPU Operator's driver upgrade controller and take it back at upgrade-done.",
    )
    evict_after = models.DateTimeField(null=True, blank=True, editable=False, help_text="Notice deadline.")
    step = models.CharField(max_length=16, choices=DrainStep, default=DrainStep.CHECK, editable=False)
    moves = models.JSONField(default=list, blank=True, editable=False)
    give_back_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the operator (or the upgrade) gave the node back."
    )
    checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    notified_at = models.DateTimeField(null=True, blank=True, editable=False)
    cordoned_at = models.DateTimeField(null=True, blank=True, editable=False)
    moved_at = models.DateTimeField(null=True, blank=True, editable=False)
    evicted_at = models.DateTimeField(null=True, blank=True, editable=False, help_text="Handed over from then.")
    returned_at = models.DateTimeField(null=True, blank=True, editable=False)
    uncordoned_at = models.DateTimeField(null=True, blank=True, editable=False)
    failed_step = models.CharField(max_length=16, choices=DrainStep, blank=True, editable=False)

    objects = NodeDrainQuerySet.as_manager()

    # step -> the timestamp field it sets when it completes (the engine writes it)
    STEP_TIMESTAMPS = {
        DrainStep.CHECK: "checked_at",
        DrainStep.NOTIFY: "notified_at",
        DrainStep.CORDON: "cordoned_at",
        DrainStep.MOVE: "moved_at",
        DrainStep.EVICT: "evicted_at",
        DrainStep.HANDOVER: "returned_at",
        DrainStep.UNCORDON: "uncordoned_at",
    }

    class Meta(NodeWorkflow.Meta):
        verbose_name = "node drain (maintenance)"
        indexes = [models.Index(fields=["state", "claimed_at"], name="capacity_nodedrain_state_claim")]

    def __str__(self) -> str:
        return f"drain #{self.pk} {self.node} ({self.phase})"

    @property
    def handed_over(self) -> bool:
        """The node is the operator's (or the upgrade controller's): reservations moved, pods gone."""
        return self.step == DrainStep.HANDOVER and self.is_open and self.state != ReconfigurationState.FAILED

    @property
    def phase(self) -> str:
        """What the console shows: "in maintenance" while handed over, else step/state."""
        if self.handed_over:
            return "in maintenance" if self.give_back_at is None else "given back, waiting for health"
        return f"{self.step}/{self.state}"


class NodeDrainStep(WorkflowTrail):
    """Audit trail of a drain: one row per step event (started, completed, waiting, failed, moved, ...)."""

    drain = models.ForeignKey(NodeDrain, on_delete=models.CASCADE, related_name="steps")
    step = models.CharField(max_length=16, choices=DrainStep)

    class Meta:
        ordering = ["drain_id", "at", "id"]
        verbose_name = "node drain step"

    def __str__(self) -> str:
        return f"drain #{self.drain_id} {self.step} {self.event}"
