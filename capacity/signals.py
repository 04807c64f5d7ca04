"""What the capacity app announces, for the apps above it (monitoring) to act on.

capacity sits below every other app, so it never calls them: it sends these signals inside the transaction
that made the change, and receivers connect in their own AppConfig.ready(). A receiver that sends work out
waits for commit (`transaction.on_commit`). No business logic of capacity hangs on them.
"""

from django.dispatch import Signal

# The kubelets' PodResources gave running device-plugin workloads of a cluster new devices
# (capacity.services.inventory): a pod started, stopped or moved. monitoring checks the cluster for trespass
# at once, rather than at the next poll. kwargs: cluster_id: int, count: int (workload rows changed).
workloads_attributed = Signal()
