"""What the pools app announces, for the apps above it to act on (notifications: e-mail, webhooks).

pools sits below monitoring and billing, so it never calls them: it sends these signals inside the
transaction that made the change, once it is made, and receivers connect in their own AppConfig.ready().
A receiver must not talk to the outside world itself: it enqueues its work with `delay_on_commit` (or
`transaction.on_commit`), so a change that is rolled back notifies nobody. No business logic hangs on them:
pools does its own work first.
"""

from __future__ import annotations

from django.dispatch import Signal

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

# A lender takes a lent unit back (pools/lending.py): the borrower's grant shrinks at once and its pods on the
# unit are evicted when the grace period ends. Sent once per loan. kwargs:
#   loan_id: int, borrower_id: int, lender_pool_id: int, allocation_id: int
#   reason: str                 why ("a lender pod is Pending for the unit", "the lender asked", ...)
#   at: datetime                when the reclaim started
#   evict_after: datetime       at + LENDING_RECLAIM_GRACE_S: the borrower's pods there are evicted then
loan_reclaimed = Signal()
