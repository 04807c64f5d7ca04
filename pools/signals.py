"""What the pools app announces, for the apps above it to act on (notifications: e-mail, webhooks).

pools sits below monitoring and billing, so it never calls them: it sends these signals inside the
transaction that made the change, after the change is written, and receivers connect in their own
AppConfig.ready(). A receiver that writes rows writes them in the same transaction (rolled back with it);
anything it sends out waits for commit (`delay_on_commit` or `transaction.on_commit`), so a change that is
rolled back notifies nobody. No business logic hangs on them: pools does its own work first.

Every signal is sent with `sender` = the model class of the row it is about.
"""

from django.dispatch import Signal

# PoolRequest moves (pools.services.transition): kwargs request, actor (a user or None), reason, at.
request_approved = Signal()  # submitted -> approved (by a person or an auto-approval policy)
request_queued = Signal()  # submitted -> queued: waiting for capacity
request_started_from_queue = Signal()  # queued -> approved: capacity freed, approved from the queue
request_refused = Signal()  # -> rejected (by an operator, or its end came while it waited)

# The queue (scheduling, above pools) is wanted: pools sends these, scheduling.receivers answers them.
# Units may have come free (a release, an expiry, a hold released, a node back): a queue pass after commit.
# Sent by pools.services.enqueue_queue_processing(); no kwargs.
queue_pass_wanted = Signal()
# A request was submitted (the API's submit and create with submit=1, the dashboard's form), after its
# submission was written: approve it by an auto-approval policy, queue it when capacity is short and it chose
# to wait, or leave it for an operator (scheduling.queue.after_submit). kwargs request.
request_submitted = Signal()

# Units of one project ended (release, expiry, a MIG reconfiguration or anything else that ends an
# allocation) and enter the "ending" state (pools/ending.py). Sent once per project and cause.
# kwargs:
#   project_id: int             the project that held the units
#   allocation_ids: list[int]   the allocations that ended, ascending
#   reason: str                 why, in the words the project page and the statement use
#   at: datetime                when they ended (billing stopped there)
#   evict_after: datetime       from then on the project's pods still on those units are evicted
#                               (at + ALLOCATION_ENDING_GRACE_S; PodDisruptionBudgets respected)
#   force_after: datetime       the hard deadline: pods a budget still protects are deleted
allocation_ending = Signal()

# An allocation ended while its pool goes on (pools.services.rehome_allocations: its MIG instance was
# destroyed with no equivalent left): kwargs allocation, cause (AllocationEndCause), reason, at.
allocation_ended = Signal()

# A lender takes a lent unit back (pools.lending.request_reclaim): the borrower's grant shrinks at once and its
# pods on the unit are evicted when the grace period ends. Sent once per loan. kwargs:
#   loan: Loan                  the loan, its state already RECLAIMING
#   loan_id: int, borrower_id: int, lender_pool_id: int, allocation_id: int
#   reason: str                 why ("a lender pod is Pending for the unit", "the lender asked", ...)
#   at: datetime                when the reclaim started
#   evict_after: datetime       at + LENDING_RECLAIM_GRACE_S: the borrower's pods there are evicted then
loan_reclaimed = Signal()


class AllocationEndCause:
    """Why an allocation ended under its project (the `cause` kwarg of allocation_ended)."""

    MIG_CHANGE = "mig_change"  # a MIG reconfiguration of its node destroyed its instance
    MAINTENANCE = "maintenance"  # its instance vanished outside a reconfiguration (GPU reset, node maintenance)
