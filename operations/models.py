"""The operations app's own rows: rolling driver/firmware upgrades (DriverUpgrade, DriverUpgradeNode).

Why here and not beside NodeDrain in capacity: a row lives in the lowest layer that reads it (STYLE.md, 14).
A rollout is read by its own workflow (operations.maintenance.rollout), the operations API and admin, and
the operator dashboard (gpuaas, above every app); capacity and pools never ask about rollouts. Its nodes
point down at capacity's NodeCapacity and NodeDrain (each node's drain-and-move), never the other way.
Docs: docs/maintenance.md, "Rolling driver upgrades".
"""

from __future__ import annotations

from django.db import models
from django.db.models import Count, Exists, OuterRef, Q

from capacity.models import Cluster, NodeCapacity, NodeDrain
from core.leases import LeasedQuerySet, LeasedWork

from .choices import UpgradeMode, UpgradeNodeState, UpgradeState

IN_FLIGHT = (UpgradeNodeState.DRAINING, UpgradeNodeState.UPGRADING)
OPEN_STATES = (UpgradeState.PENDING, UpgradeState.RUNNING, UpgradeState.PAUSED)


class DriverUpgradeQuerySet(LeasedQuerySet):
    def open(self):
        return self.filter(state__in=OPEN_STATES)

    def to_tick(self):
        """Rollouts the tick still follows: open ones, and cancelled ones whose started nodes are still out."""
        in_flight = DriverUpgradeNode.objects.filter(rollout=OuterRef("pk"), state__in=IN_FLIGHT)
        return self.filter(Q(state__in=OPEN_STATES) | Q(Exists(in_flight), state=UpgradeState.CANCELLED))

    def with_progress(self):
        """Per-state node counts in one query (nodes_total, nodes_done, nodes_failed, nodes_in_flight)."""
        return self.annotate(
            nodes_total=Count("nodes"),
            nodes_done=Count("nodes", filter=Q(nodes__state=UpgradeNodeState.DONE)),
            nodes_failed=Count("nodes", filter=Q(nodes__state=UpgradeNodeState.FAILED)),
            nodes_in_flight=Count("nodes", filter=Q(nodes__state__in=IN_FLIGHT)),
        )


class DriverUpgrade(LeasedWork):
    """A rolling driver/firmware upgrade of a set of a cluster's nodes, in waves inside maintenance windows.

    Each wave is at most `max_parallel` nodes whose reservations the free reserve absorbs together
    (operations.maintenance.next_wave); each node is drained and moved (a NodeDrain) and then upgraded by
    the GPU Operator's controller (`mode` controller) or by the operator (`own_drain`). `claim_token` and
    `lease_expires_at` (core.leases.LeasedWork) are the tick's claim (one worker at a time); `tick_due_at` when the
    next tick is due.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="driver_upgrades")
    name = models.CharField(max_length=200, blank=True, help_text="Driver 570.x, firmware 96.00.x, ...")
    node_group = models.CharField(max_length=100, blank=True, help_text="Only this node group (empty: the selection).")
    mode = models.CharField(max_length=16, choices=UpgradeMode, default=UpgradeMode.CONTROLLER)
    max_parallel = models.PositiveIntegerField(help_text="Largest wave (ClusterPolicy maxParallelUpgrades).")
    max_parallel_source = models.CharField(max_length=40, blank=True, editable=False)
    grace_s = models.PositiveIntegerField(default=3600, help_text="Notice before each node's moved pods are evicted.")
    state = models.CharField(max_length=16, choices=UpgradeState, default=UpgradeState.PENDING, editable=False)
    current_wave = models.PositiveIntegerField(default=0, editable=False)
    waiting_for = models.CharField(max_length=300, blank=True, editable=False, help_text="Why no wave starts now.")
    next_window_at = models.DateTimeField(null=True, blank=True, editable=False)
    tick_due_at = models.DateTimeField(null=True, blank=True, editable=False)
    started_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = DriverUpgradeQuerySet.as_manager()

    # What the operator chose at the start, in the order the admin page and the API show it.
    SETTINGS_FIELDS = ("cluster", "name", "node_group", "mode", "max_parallel", "max_parallel_source", "grace_s")

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "driver upgrade (rolling)"
        constraints = [
            models.CheckConstraint(condition=Q(max_parallel__gte=1), name="operations_driverupgrade_max_parallel_min")
        ]
        indexes = [models.Index(fields=["state", "tick_due_at"], name="operations_upgrade_state_due")]

    def __str__(self) -> str:
        return f"upgrade #{self.pk} {self.name or self.cluster} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES


class DriverUpgradeNode(models.Model):
    """One node of a rollout: its wave, its drain and how far it got (with the time of each stage)."""

    rollout = models.ForeignKey(DriverUpgrade, on_delete=models.CASCADE, related_name="nodes")
    node = models.ForeignKey(NodeCapacity, on_delete=models.PROTECT, related_name="driver_upgrades")
    position = models.PositiveIntegerField(default=0, help_text="Order within the rollout.")
    wave = models.PositiveIntegerField(null=True, blank=True, editable=False)
    state = models.CharField(max_length=16, choices=UpgradeNodeState, default=UpgradeNodeState.PENDING, editable=False)
    drain = models.OneToOneField(
        NodeDrain, null=True, blank=True, on_delete=models.SET_NULL, related_name="upgrade_node", editable=False
    )
    draining_at = models.DateTimeField(null=True, blank=True, editable=False)
    upgrading_at = models.DateTimeField(null=True, blank=True, editable=False)
    done_at = models.DateTimeField(null=True, blank=True, editable=False)
    failed_at = models.DateTimeField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True, editable=False)

    class Meta:
        ordering = ["rollout_id", "position", "id"]
        verbose_name = "driver upgrade node"
        constraints = [
            models.UniqueConstraint(fields=["rollout", "node"], name="operations_driverupgradenode_unique_node")
        ]
        indexes = [models.Index(fields=["rollout", "state"], name="operations_upgradenode_state")]

    def __str__(self) -> str:
        return f"{self.node} in upgrade #{self.rollout_id} ({self.state})"
