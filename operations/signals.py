"""What the operations app announces, for the apps above it (notifications: e-mail, webhooks).

Sent inside the transaction that made the change, as pools.signals are (receivers write in it and send
after commit). Every signal is sent with `sender` = the model class of the row it is about.
"""

from django.dispatch import Signal

# Drain-and-move (operations/maintenance) told a project that its reservations on a node move and that
# its pods there are evicted at the deadline. Sent once per drain and project. kwargs:
#   drain: NodeDrain            the drain (its node and reason)
#   project_id: int             the project holding reservations on the node
#   allocation_ids: list[int]   its active allocations there, ascending
#   evict_after: datetime       from then on its pods on the node are evicted (PodDisruptionBudgets respected)
#   at: datetime                when the notice went out
maintenance_notice = Signal()
