"""Choice sets of the monitoring app."""

from django.db import models


class HealthLevel(models.TextChoices):
    """The seed's status colours: Normal (green), Warning (amber), Critical (red)."""

    NORMAL = "normal", "Normal"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"


class HealthRule(models.TextChoices):
    """What raised a health event; the level of each rule is in monitoring/health.py (RULES)."""

    ECC_DBE = "ecc_dbe", "ECC double-bit (uncorrectable) errors"
    XID_CRITICAL = "xid_critical", "Critical XID error"
    XID_WARNING = "xid_warning", "XID error (application or recoverable)"
    REMAP_PENDING = "remap_pending", "Row remap pending (reset needed)"
    REMAP_FAILURE = "remap_failure", "Row remap failed"
    THERMAL_THROTTLE = "thermal_throttle", "Thermal clock throttling"
    POWER_THROTTLE = "power_throttle", "Power-brake / power-cap throttling"
    GPU_LOST = "gpu_lost", "GPU lost (fell off the bus)"


class MetricSource(models.TextChoices):
    NVML = "nvml", "NVML (node agent)"
    DCGM = "dcgm", "DCGM exporter"


class RollupLevel(models.TextChoices):
    FIVE_MINUTES = "5m", "5 minutes"
    HOUR = "1h", "1 hour"


class IdleProposal(models.TextChoices):
    RELEASE = "release", "Release"
    DOWNSIZE = "downsize", "Downsize"


class IdleState(models.TextChoices):
    OPEN = "open", "Open"
    DISMISSED = "dismissed", "Dismissed"
    RELEASED = "released", "Released"
    CLEARED = "cleared", "Cleared (busy again or allocation gone)"


class ShareState(models.TextChoices):
    OPEN = "open", "Over its share"
    EVICTED = "evicted", "Evicted"
    EVICTION_FAILED = "eviction_failed", "Eviction failed"
    RESOLVED = "resolved", "Back within its share"


class TrespassKind(models.TextChoices):
    FOREIGN_POD = "foreign_pod", "Pod on another project's unit"
    UNALLOCATED_POD = "unallocated_pod", "Pod on an unallocated unit"
    UNALLOCATED_ACTIVITY = "unallocated_activity", "Activity on an unallocated unit"
