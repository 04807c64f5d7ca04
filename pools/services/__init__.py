"""The pool-request workflow: draft -> submitted -> approved -> provisioning -> active -> released.

One module per step; the workflow's API is importable from pools.services:

requests      the states and their one gate, transition(); create, submit, withdraw, reject, release
approval      a request takes free units and becomes a pool
provisioning  a pool's provisioning runs: claim, outcome, retry, sweep (the Kubernetes work: pools/provisioning/)
allocations   units that end or move: release, expiry, rehoming, moves
declarations  a declaration turned into the spec a request stores (pinned or matched), or refused

The modules call the enqueue_* hooks through this package (`services.enqueue_provisioning(pool)`), so a test
or benchmark that patches pools.services.enqueue_* reaches every call, as when the services were one module.
"""

from .allocations import (
    expire_due,
    move_allocation,
    move_mig_allocation,
    rehome_allocations,
    release_allocation,
    release_unit,
)
from .approval import APPROVAL_ATTEMPTS, approve
from .provisioning import (
    claim_provisioning,
    mark_failed,
    mark_provisioned,
    pools_awaiting_cleanup,
    retry_provisioning,
    set_share_priority,
    sweep_provisioning,
)
from .requests import (
    LOANS_END_ON_LEAVING_QUEUE,
    TRANSITIONS,
    S,
    _user,
    create_request,
    enqueue_deprovisioning,
    enqueue_provisioning,
    enqueue_queue_processing,
    fleet_mig_products,
    inventory_products,
    is_legal,
    may_request_capacity,
    reject,
    release,
    resolve_spec,
    submit,
    transition,
    withdraw,
)

__all__ = [
    "APPROVAL_ATTEMPTS",
    "LOANS_END_ON_LEAVING_QUEUE",
    "S",
    "TRANSITIONS",
    "approve",
    "claim_provisioning",
    "create_request",
    "enqueue_deprovisioning",
    "enqueue_provisioning",
    "enqueue_queue_processing",
    "expire_due",
    "fleet_mig_products",
    "inventory_products",
    "is_legal",
    "mark_failed",
    "mark_provisioned",
    "may_request_capacity",
    "move_allocation",
    "move_mig_allocation",
    "pools_awaiting_cleanup",
    "rehome_allocations",
    "reject",
    "release",
    "release_allocation",
    "release_unit",
    "resolve_spec",
    "retry_provisioning",
    "set_share_priority",
    "submit",
    "sweep_provisioning",
    "transition",
    "_user",
    "withdraw",
]
