"""Projects' pool requests, the pools they hold and the concrete units allocated to them.

Project itself lives in tenancy (the bottom layer); every object here is scoped to the caller's
projects through `project__in=<projects the user may view>` in one query (tenancy.roles).

One module per domain; every model is importable from pools.models (Django finds them here):

requests   PoolRequest and its transitions
pools      GpuPool and PoolCluster (a pool's units on each cluster)
queue      the queue's tables: auto-approval policies, weights, entries and their audit
loans      loans of idle units and best-effort requests
evictions  the audit of every eviction
"""

# A unit held by a pool is capacity's Allocation (capacity/models/reservations.py: "free" is defined beside it);
# pools creates and ends them, and names it here too (`from pools.models import Allocation`).
from capacity.models.reservations import SHARE_FIELDS, Allocation, AllocationQuerySet

from .evictions import Eviction
from .loans import BestEffortRequest, Loan
from .pools import LABEL_PREFIX, SHARED_NODE_NOTE, GpuPool, GpuPoolQuerySet, PoolCluster, claim_template_name, gpu_count
from .queue import AutoApprovalPolicy, ProjectQueueWeight, QueueEntry, QueueEvent
from .requests import HOLDING_STATES, PENDING_FIRST, PoolRequest, PoolRequestTransition

__all__ = [
    "HOLDING_STATES",
    "LABEL_PREFIX",
    "PENDING_FIRST",
    "SHARED_NODE_NOTE",
    "SHARE_FIELDS",
    "Allocation",
    "AllocationQuerySet",
    "AutoApprovalPolicy",
    "BestEffortRequest",
    "Eviction",
    "GpuPool",
    "GpuPoolQuerySet",
    "Loan",
    "PoolCluster",
    "PoolRequest",
    "PoolRequestTransition",
    "ProjectQueueWeight",
    "QueueEntry",
    "QueueEvent",
    "claim_template_name",
    "gpu_count",
]
