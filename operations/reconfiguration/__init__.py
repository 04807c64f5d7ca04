"""MIG reconfiguration: a per-node state machine stored in MigReconfiguration, one Celery task per step.

    plan -> check -> cordon -> drain -> apply -> verify -> uncordon -> done

- plan: per-GPU placements of the target (capacity.mig.layout.validate_layout, reusing existing
  instances), the layout before (for roll-back); GPUs already in the target are left alone, and a
  node with nothing to change jumps to uncordon.
- check: refuses while an affected GPU carries an active pools.Allocation unless `drain`, and
  outside every maintenance window unless `force`; the node must still exist.
- cordon: spec.unschedulable (remembering whether it was cordoned before, so we only undo our own).
- drain: evicts (drain) or waits for the GPU pods of the affected GPUs, re-checking with a countdown
  until MIG_DRAIN_TIMEOUT_S.
- apply, two backends:
  * operator: gpuaas's mig-parted ConfigMap gets the config, the node label nvidia.com/mig.config is
    set to it, then nvidia.com/mig.config.state is polled (pending -> success | failed);
  * agent: a signed MIG command goes to the node agent's queue (node_queue(cluster, node)), whose NVML
    destroys and creates GPU and compute instances at the planned placements; its signed result (with
    the inventory read back) is recorded by the control plane, then apply advances (commands.py).
- verify (on the control plane, like every step; the node agent reads NVML: on the operator path an
  inventory read that apply asked for on success and verify waits for, dated at or after it; on the
  agent path the result's read-back inventory): on the operator path the state label says
  success for our config; rediscovery of the node (inventory) shows the planned instances: exact
  placements on the agent path, the same profiles on the operator path, whose placements mig-parted
  chooses (the observed ones are recorded). MIG allocations whose instance was recreated at the same
  placement are pointed at the new instance.
- uncordon: only if gpuaas cordoned it.

Claiming: a step runs only after `UPDATE ... SET state='running', claim_token=<task id> WHERE
step=<step> AND (state IN ('pending','waiting') OR (state='running' AND claim_token=<task id>))`
touched one row. A redelivered task (same id, after a worker died: acks_late) re-claims its own step
and carries on; every step is re-entrant (apply looks at what is already there, cordon and label
writes are idempotent). The claim carries a lease (lease_expires_at, WORKFLOW_LEASE_S) that a
heartbeat thread renews while the step runs (core.leases.Heartbeat); a running step whose lease
ran out belongs to a dead worker, and sweep() (beat, every MIG_RECONFIG_SWEEP_S) puts it back to
pending and re-sends it, without waiting for the broker's redelivery. Waiting steps never sleep:
they return Wait and are re-enqueued with a countdown (MIG_RECONFIG_POLL_S, far below the broker's
visibility timeout) until their deadline.

Failure: any error stops the reconfiguration in state failed at that step, with the error stored
and the node left as it is (cordoned once cordon ran). resume() re-runs the failed step; rollback()
closes it and starts a new reconfiguration back to the layout recorded before. Every step event is a
MigReconfigurationStep row (the audit trail).
"""

from .engine import (
    MIG,
    ORDER,
    Workflow,
    idle_s,
    poll_interval_s,
    run_step,
    run_workflow_step,
    step_timeout_s,
    sweep,
    sweep_workflow,
)
from .lifecycle import cancel, create, create_from, resume, rollback
from .outcomes import Advance, IllegalTransition, ReconfigurationError, Refused, Wait
from .plan import GpuPlan, Impact, assess, current_layouts, gpu_pods, plan_node, target_from
from .records import audit
from .steps import STEPS, config_name_for

__all__ = [
    "MIG",
    "ORDER",
    "STEPS",
    "Advance",
    "GpuPlan",
    "IllegalTransition",
    "Impact",
    "ReconfigurationError",
    "Refused",
    "Wait",
    "Workflow",
    "assess",
    "audit",
    "cancel",
    "config_name_for",
    "create",
    "create_from",
    "current_layouts",
    "gpu_pods",
    "idle_s",
    "plan_node",
    "poll_interval_s",
    "resume",
    "rollback",
    "run_step",
    "run_workflow_step",
    "step_timeout_s",
    "sweep",
    "sweep_workflow",
    "target_from",
]
