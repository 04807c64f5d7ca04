"""What the pools app announces: events a higher layer (notifications) may tell people about.

Each signal is sent by the service that makes the change, inside its transaction, after the change is
written: a receiver that writes rows writes them in the same transaction (rolled back with it), and
anything it sends out must wait for commit (transaction.on_commit). Receivers hold no business logic
of the pools app (STYLE.md: services call what they need explicitly); these only tell.

Every signal is sent with `sender` = the model class of the row it is about.
"""

from django.dispatch import Signal

# PoolRequest moves (pools.services.transition): kwargs request, actor (a user or None), reason, at.
request_approved = Signal()  # submitted -> approved (by a person or an auto-approval policy)
request_queued = Signal()  # submitted -> queued: waiting for capacity
request_started_from_queue = Signal()  # queued -> approved: capacity freed, approved from the queue
request_refused = Signal()  # -> rejected (by an operator, or its end came while it waited)

# A lender asked for a lent unit back (pools.lending.request_reclaim): kwargs loan, reason, at.
loan_reclaimed = Signal()

# An allocation ended while its pool goes on (pools.services.rehome_allocations: its MIG instance was
# destroyed with no equivalent left): kwargs allocation, cause (AllocationEndCause), reason, at.
allocation_ended = Signal()


class AllocationEndCause:
    """Why an allocation ended under its project (the `cause` kwarg of allocation_ended)."""

    MIG_CHANGE = "mig_change"  # a MIG reconfiguration of its node destroyed its instance
    MAINTENANCE = "maintenance"  # its instance vanished outside a reconfiguration (GPU reset, node maintenance)
