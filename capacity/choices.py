"""Choice sets of the capacity app."""

from django.db import models


class ClusterStatus(models.TextChoices):
    NEW = "new", "New"
    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    ERROR = "error", "Error"


class Binding(models.TextChoices):
    """How a pod is bound to a unit on a cluster: by count through the device plugin's extended resources,
    or to the exact devices a claim's selector admits through DRA (docs/dra.md)."""

    DEVICE_PLUGIN = "device-plugin", "Device plugin (by count)"
    DRA = "dra", "DRA (exact device)"


class Tier(models.TextChoices):
    """The seed's virtualisation tiers, from the node label gpuaas.io/tier."""

    SLA_INFERENCE = "1", "Tier 1: MIG, SLA inference"
    STAGING = "2", "Tier 2: MIG/vGPU, staging"
    DEVELOPMENT = "3", "Tier 3: time-slicing, development"
    TRAINING = "full", "Full GPUs, training"
    NONE = "", "Untiered"


class SharingStrategy(models.TextChoices):
    """How the device plugin shares a GPU between pods (label nvidia.com/gpu.sharing-strategy)."""

    TIME_SLICING = "time-slicing", "Time-slicing (no limits: one pod can take all memory and compute)"
    MPS = "mps", "MPS (each client capped at memory / replicas and 100 / replicas % of the SMs)"


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
    VGPU = "vgpu", "vGPU (virtual machines)"
    # A replica of a GPU whose device plugin shares it through MPS: its own unit kind, priced as its own share.
    MPS = "mps", "MPS share"


# Replicas of a node's shared GPU (nvidia.com/gpu advertised `replicas` times): a unit is (GPU, replica index).
SHARED_SPEC_KINDS = (SpecKind.TIMESLICE, SpecKind.MPS)


class MigInstanceState(models.TextChoices):
    ACTIVE = "active", "Active"
    GONE = "gone", "Gone"


class Availability(models.TextChoices):
    """Where a unit (MIG instance, whole GPU) stands for approval; the first state that applies wins.

    Only FREE units can be approved. The order is the one `annotate_availability()` checks in: a
    unit that is held or busy says so even on a cordoned node, because that is what its user sees.
    """

    IN_USE = "in_use", "In use"
    RESERVED = "reserved", "Reserved"
    # Its reservation ended and the project's pods are being evicted (pools/ending.py): given to nobody until empty.
    ENDING = "ending", "Ending (being emptied)"
    RECONFIGURING = "reconfiguring", "Mid-reconfiguration"
    CORDONED = "cordoned", "Cordoned or not ready"
    WITHHELD = "withheld", "Withheld (health)"
    # A MIG instance whose profile its node's tier does not admit (TierProfilePolicy): approval never
    # gives it out while the policy stands. Shown with the tier's rule, capacity.tiers.withheld_label().
    TIER_POLICY = "tier_policy", "Withheld by tier policy"
    FREE = "free", "Free"


class DiscoveryStatus(models.TextChoices):
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


# --- MIG reconfiguration, maintenance windows, time-slicing (reconfiguration section) -------------


class ReconfigurationBackend(models.TextChoices):
    OPERATOR = "operator", "GPU Operator (nvidia.com/mig.config label)"
    AGENT = "agent", "Node agent (NVML, explicit placements)"


class ReconfigurationStep(models.TextChoices):
    """The workflow's steps, in order; `done` is where a finished reconfiguration rests."""

    PLAN = "plan", "Plan"
    CHECK = "check", "Check"
    CORDON = "cordon", "Cordon"
    DRAIN = "drain", "Evict / wait for GPU pods"
    APPLY = "apply", "Apply"
    VERIFY = "verify", "Verify"
    UNCORDON = "uncordon", "Uncordon"
    DONE = "done", "Done"


class ReconfigurationState(models.TextChoices):
    """Where the current step stands. Open states hold the node; only one open reconfiguration per node."""

    PENDING = "pending", "Pending (step queued)"
    RUNNING = "running", "Running (step claimed by a worker)"
    WAITING = "waiting", "Waiting (step re-checks with a countdown)"
    FAILED = "failed", "Failed (node left cordoned; resume or roll back)"
    SUCCEEDED = "succeeded", "Succeeded"
    ROLLED_BACK = "rolled_back", "Rolled back"
    CANCELLED = "cancelled", "Cancelled"


class DrainStep(models.TextChoices):
    """Drain-and-move (NodeDrain), in order; `done` is where a finished one rests (operations/maintenance)."""

    CHECK = "check", "Check the reserve"
    NOTIFY = "notify", "Notify projects"
    CORDON = "cordon", "Cordon"
    MOVE = "move", "Move reservations"
    EVICT = "evict", "Evict pods after the grace"
    HANDOVER = "handover", "Handed over (in maintenance)"
    UNCORDON = "uncordon", "Uncordon, capacity back"
    DONE = "done", "Done"


class ReconfigurationEvent(models.TextChoices):
    CREATED = "created", "Created"
    STARTED = "started", "Step started"
    COMPLETED = "completed", "Step completed"
    WAITING = "waiting", "Waiting"
    FAILED = "failed", "Failed"
    RESUMED = "resumed", "Resumed"
    ROLLBACK = "rollback", "Roll-back started"
    CANCELLED = "cancelled", "Cancelled"
    INFO = "info", "Note"


class OnboardingStatus(models.TextChoices):
    APPLIED = "applied", "Applied"
    FAILED = "failed", "Failed"


class AgentHealth(models.TextChoices):
    """A node agent's health from its latest report (NodeCapacity.agent_health)."""

    OK = "ok", "OK"
    STALE = "stale", "Stale"
    NEVER = "never", "Never reported"


class AllocationState(models.TextChoices):
    """An allocation: held; ended but its project's pods not yet off the unit (pools/ending.py); ended."""

    ACTIVE = "active", "Active"
    ENDING = "ending", "Ending (pods being evicted)"
    ENDED = "ended", "Ended"
