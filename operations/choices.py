"""Choice sets of the operations app (its own rows: rolling driver upgrades)."""

from django.db import models


class UpgradeMode(models.TextChoices):
    """Who upgrades a node once gpuaas has drained it and moved its reservations."""

    CONTROLLER = "controller", "GPU Operator upgrade controller (label upgrade-required, back at upgrade-done)"
    OWN_DRAIN = "own_drain", "Own drain (controller off: the operator upgrades and gives the node back)"


class UpgradeState(models.TextChoices):
    PENDING = "pending", "Pending (not started)"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused (no new wave starts)"
    SUCCEEDED = "succeeded", "Succeeded (every node upgraded)"
    FAILED = "failed", "Finished with failed nodes"
    CANCELLED = "cancelled", "Cancelled"


class UpgradeNodeState(models.TextChoices):
    PENDING = "pending", "Pending"
    DRAINING = "draining", "Draining (reservations moving, pods evicted after the notice)"
    UPGRADING = "upgrading", "Upgrading (handed over)"
    DONE = "done", "Done"
    FAILED = "failed", "Failed (stays cordoned in maintenance)"
