"""What the capacity app announces, for the apps above it (pools, monitoring) to act on.

capacity sits below every other app, so it never calls them: it sends these signals inside the transaction
that made the change (`send`, not `send_robust`: a receiver that fails rolls the change back with it), and
receivers connect in their own AppConfig.ready(). A receiver that sends work out waits for commit
(`transaction.on_commit`).
"""

from django.dispatch import Signal

# The kubelets' PodResources gave running device-plugin workloads of a cluster new devices
# (capacity.services.inventory): a pod started, stopped or moved. monitoring checks the cluster for trespass
# at once, rather than at the next poll. kwargs: cluster_id: int, count: int (workload rows changed).
workloads_attributed = Signal()

# Discovery found MIG instances gone (capacity.services.inventory, after writing their replacements): an
# active allocation on a destroyed instance would go on being billed, so pools moves or ends it in the same
# transaction. kwargs: instance_ids: list[int] (sorted, never empty), at: datetime.
instances_gone = Signal()

# A node is back (listed again, Ready again, uncordoned): units there may be free again, so pools gives its
# queue a pass after commit. No kwargs.
capacity_appeared = Signal()

# A node agent's signed MIG result reached the control plane (capacity.agent.tasks.mig_result_task):
# operations checks it against the reconfiguration whose command it answers and stores it. The first
# receiver's answer ("recorded", "duplicate", "refused: why") is the task's result. kwargs: report: dict.
mig_result_reported = Signal()
