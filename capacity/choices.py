"""Choice sets of the capacity app."""

from django.db import models


class ClusterStatus(models.TextChoices):
    NEW = "new", "New"
    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    ERROR = "error", "Error"


class Tier(models.TextChoices):
    """The seed's virtualisation tiers, from the node label gpuaas.io/tier."""

    SLA_INFERENCE = "1", "Tier 1: MIG, SLA inference"
    STAGING = "2", "Tier 2: MIG/vGPU, staging"
    DEVELOPMENT = "3", "Tier 3: time-slicing, development"
    TRAINING = "full", "Full GPUs, training"
    NONE = "", "Untiered"


class MigStrategy(models.TextChoices):
    NONE = "none", "none"
    SINGLE = "single", "single"
    MIXED = "mixed", "mixed"


class GpuHealth(models.TextChoices):
    OK = "ok", "OK"
    WARNING = "warning", "Warning"
    UNHEALTHY = "unhealthy", "Unhealthy"
    LOST = "lost", "Lost (fell off the bus)"


class SpecKind(models.TextChoices):
    FULL = "full", "Full GPU"
    MIG = "mig", "MIG instance"
    TIMESLICE = "timeslice", "Time-slice replica"


class MigInstanceState(models.TextChoices):
    ACTIVE = "active", "Active"
    GONE = "gone", "Gone"


class DiscoveryStatus(models.TextChoices):
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
