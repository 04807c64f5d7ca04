"""Maintenance: the take-offline check, and drain-and-move on the reconfiguration engine.

    check -> notify -> cordon -> move -> evict -> handover -> uncordon -> done

- check: the free reserve must absorb every reservation on the node (take_offline_check); otherwise it
  refuses with the shortfall, and start() refuses before anything is written.
- notify: each project with reservations there is told the deadline (now + grace_s) at which its pods
  on the node are evicted (operations.signals.maintenance_notice -> notifications).
- cordon: in Kubernetes and in the inventory, so no pod lands there and approval offers none of its units.
- move: each reservation moves to an equivalent free unit (same kind, product, profile, tier and
  cluster, the project's other nodes first) under approval's row locks (pools.services.move_allocation),
  which reconciles the project's quota and DRA templates. Billing never stops: the allocation is the same.
- evict: after the deadline, the GPU pods left on the node are evicted (the reconfiguration drain's
  eviction, PodDisruptionBudgets respected); their controllers start them on the moved units.
- handover: the node is the operator's ("in maintenance") until give_back(), then until it is Ready
  with every GPU healthy.
- uncordon: only our own cordon; the units go back to approval and the queue.

The engine (operations.reconfiguration.engine.Workflow) claims each step with a conditional UPDATE,
holds a lease renewed by a heartbeat, and its sweep re-queues a dead worker's step; every event is a
NodeDrainStep row. A failed drain stops where it failed (the node stays cordoned); resume() re-runs it.
Docs: docs/maintenance.md.
"""

from capacity.choices import DrainStep
from capacity.models import NodeDrain
from operations.reconfiguration.engine import Workflow, run_workflow_step, sweep_workflow
from pools.services import enqueue_queue_processing

from .check import HitAllocation, OfflineCheck, take_offline_check
from .lifecycle import give_back, resume, start
from .records import audit, enqueue
from .steps import STEPS, node_health
from .upgrades import next_wave, start_wave

ORDER = [
    DrainStep.CHECK,
    DrainStep.NOTIFY,
    DrainStep.CORDON,
    DrainStep.MOVE,
    DrainStep.EVICT,
    DrainStep.HANDOVER,
    DrainStep.UNCORDON,
    DrainStep.DONE,
]


def _no_step_timeout(step: str) -> None:
    """Drain steps keep their own deadlines: evict counts from the notice deadline, handover has none."""
    return None


def _give_units_back(drain) -> None:
    enqueue_queue_processing()


MAINTENANCE = Workflow(
    name="maintenance",
    model=NodeDrain,
    steps=STEPS,
    order=ORDER,
    audit=audit,
    enqueue=enqueue,
    timeout_s=_no_step_timeout,
    on_done=_give_units_back,
)


def run_step(drain_id: int, step: str, *, token: str, now=None) -> str:
    """Claim `step` of the drain and run it once (the engine's run_workflow_step)."""
    return run_workflow_step(MAINTENANCE, drain_id, step, token=token, now=now)


def sweep(now=None) -> dict[str, int]:
    """Give a dead worker's drain step back and re-send lost messages (the engine's sweep_workflow)."""
    return sweep_workflow(MAINTENANCE, now)


__all__ = [
    "MAINTENANCE",
    "ORDER",
    "STEPS",
    "HitAllocation",
    "OfflineCheck",
    "give_back",
    "next_wave",
    "node_health",
    "resume",
    "run_step",
    "start",
    "start_wave",
    "sweep",
    "take_offline_check",
]
