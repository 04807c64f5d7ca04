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
    """What a team declares about isolation; matching turns it into a kind of unit (pools/matching.py)."""

    NONE = "none", "None: sharing a GPU is fine"
    MEMORY = "memory", "Own memory (dedicated framebuffer), compute may be time-sliced"
    HARDWARE = "hardware", "Hardware: own compute and memory (MIG or whole GPUs)"


# What a request's `isolation` accepts: a need (matching chooses the kind) or a kind (the team pins it).
ISOLATION_OR_NEED = [*IsolationNeed.choices, *Isolation.choices]


class AllocationState(models.TextChoices):
    """An allocation: held; ended but its project's pods not yet off the unit (pools/ending.py); ended."""

    ACTIVE = "active", "Active"
    ENDING = "ending", "Ending (pods being evicted)"
    ENDED = "ended", "Ended"


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
