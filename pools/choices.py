"""Choice sets of the pools app."""

from django.db import models


class Isolation(models.TextChoices):
    MIG = "mig", "Hardware-isolated (MIG)"
    FULL = "full", "Full GPU"
    TIMESLICE = "timeslice", "Shared (time-slicing)"
    MPS = "mps", "Shared with limits (MPS)"
    VGPU = "vgpu", "vGPU for a virtual machine"


class WorkloadType(models.TextChoices):
    INFERENCE = "inference", "Inference"
    STAGING = "staging", "Staging"
    DEVELOPMENT = "development", "Development"
    TRAINING = "training", "Training"


class RequestState(models.TextChoices):
    DRAFT = "draft", "Draft"
    SUBMITTED = "submitted", "Submitted"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    WITHDRAWN = "withdrawn", "Withdrawn"
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"
    FAILED = "failed", "Failed"
    QUEUED = "queued", "Queued (waiting for capacity)"


class PriorityClass(models.TextChoices):
    """The queue's first key: production before staging before development."""

    PRODUCTION = "production", "Production"
    STAGING = "staging", "Staging"
    DEVELOPMENT = "development", "Development"


class SharePriority(models.TextChoices):
    """An operator's priority for a time-sliced or MPS pool: which project's pods go first when a shared GPU is
    over-subscribed (over-share enforcement evicts the lowest first). Each maps to a Kubernetes PriorityClass
    gpuaas creates (SHARE_PRIORITY_CLASSES)."""

    HIGH = "high", "High"
    NORMAL = "normal", "Normal"
    LOW = "low", "Low"


# SharePriority -> (PriorityClass name, value). Values sit between the borrowed class (-100) and the default
# (0 for pods without a class) at "low", above it otherwise; preemptionPolicy Never: gpuaas evicts, the
# scheduler does not preempt (capacity/adapters/kubernetes/scheduling.py).
SHARE_PRIORITY_CLASSES: dict[str, tuple[str, int]] = {
    SharePriority.HIGH: ("gpuaas-shared-high", 2000),
    SharePriority.NORMAL: ("gpuaas-shared-normal", 1000),
    SharePriority.LOW: ("gpuaas-shared-low", -10),
}
# Lower rank is evicted first.
SHARE_PRIORITY_RANK = {SharePriority.LOW: 0, SharePriority.NORMAL: 1, SharePriority.HIGH: 2}


class QueueAction(models.TextChoices):
    """What happened to a queued request, for the queue's audit trail."""

    QUEUED = "queued", "Queued"
    MOVED = "moved", "Moved"
    HELD = "held", "Held"
    UNHELD = "unheld", "Hold released"
    CANCELLED = "cancelled", "Cancelled"
    AUTO_APPROVED = "auto_approved", "Approved by policy"
    APPROVED = "approved", "Approved by an operator"
    APPROVABLE = "approvable", "Can be approved now"
    WITHDRAWN = "withdrawn", "Withdrawn"


class PoolState(models.TextChoices):
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    FAILED = "failed", "Failed"
    RELEASED = "released", "Released"


class PoolClusterState(models.TextChoices):
    """One cluster's part of a pool (PoolCluster.state): computed from its timestamps and error, not stored."""

    PROVISIONING = "provisioning", "Provisioning"
    PROVISIONED = "provisioned", "Provisioned"
    FAILED = "failed", "Failed"
    CLEANING_UP = "cleaning_up", "Cleaning up"
    CLEANED_UP = "cleaned_up", "Cleaned up"


class IsolationNeed(models.TextChoices):
    """What a team declares about isolation; matching turns it into a kind of unit (pools/units/matching.py)."""

    NONE = "none", "None: sharing a GPU is fine"
    MEMORY = "memory", "Own memory (dedicated framebuffer), compute may be time-sliced"
    HARDWARE = "hardware", "Hardware: own compute and memory (MIG or whole GPUs)"


# What a request's `isolation` accepts: a need (matching chooses the kind) or a kind (the team pins it).
ISOLATION_OR_NEED = [*IsolationNeed.choices, *Isolation.choices]


class EvictionOutcome(models.TextChoices):
    """What one eviction attempt did (pools.Eviction, the audit of every eviction gpuaas makes)."""

    EVICTED = "evicted", "Evicted (Eviction API)"
    BLOCKED = "blocked", "Blocked by a PodDisruptionBudget (429)"
    FORCED = "forced", "Deleted at the hard deadline"
    GONE = "gone", "Already gone"
    FAILED = "failed", "Failed"


class LoanState(models.TextChoices):
    """A lent unit: lent, being taken back (grace period running), or back with its lender."""

    ACTIVE = "active", "Lent"
    RECLAIMING = "reclaiming", "Reclaiming (grace period)"
    ENDED = "ended", "Ended"


class BestEffortState(models.TextChoices):
    """A best-effort request: served from idle units while open; ended by its project or its `until`."""

    OPEN = "open", "Open"
    ENDED = "ended", "Ended"
