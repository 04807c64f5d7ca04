"""Celery tasks of the operations app: thin wrappers that load ids and call services.

MIG reconfiguration: each workflow step is one task run on the control plane (default queue); waiting
steps re-enqueue themselves with a countdown far below the Redis visibility timeout. No step runs on a
node's queue: the agent backend's NVML work goes to the node's agent as a signed command
(apply_mig_task) whose signed result comes back as capacity's mig_result_task (the signal
mig_result_reported, which operations.apps connects to record_result), and both backends' verify asks the
agent for a fresh inventory (read_node_inventory_task), which comes back through the ingest queue.
A verify step the previous release queued on a node queue comes to nothing there (a thin agent fails it
on its first query, or it expires unserved); the sweep re-sends the step here once it has sat idle for
idle_s() (docs/deploying.md, agent version skew).

The tasks keep the names they had in capacity.tasks: queued messages, the beat entry
(CELERY_BEAT_SCHEDULE "capacity-sweep-reconfigurations") and running node agents name them.
"""

from __future__ import annotations

from celery import shared_task

from operations import maintenance
from operations.maintenance import rollout_tick
from operations.reconfiguration import run_step, sweep

# A step message older than this is dropped; sweep_reconfigurations_task re-enqueues lost steps.
RECONFIGURATION_STEP_EXPIRES_S = 10 * 60


def _send(task, args: tuple, countdown: int | None) -> None:
    """Send a workflow message that expires RECONFIGURATION_STEP_EXPIRES_S after it is due (the sweeps re-send)."""
    options: dict = {"expires": (countdown or 0) + RECONFIGURATION_STEP_EXPIRES_S}
    if countdown:
        options["countdown"] = countdown
    task.apply_async(args, **options)


@shared_task(name="capacity.tasks.reconfiguration_step_task", bind=True, acks_late=True)
def reconfiguration_step_task(self, reconfiguration_id: int, step: str) -> str:
    """Run one step of a MIG reconfiguration. Idempotent: the step is claimed with a conditional
    UPDATE (a stale or duplicate message does nothing) and re-entered when this same task is
    redelivered after a worker died."""
    return run_step(reconfiguration_id, step, token=self.request.id or "local")


def enqueue_reconfiguration_step(reconfiguration_id: int, step: str, *, countdown: int | None = None) -> None:
    """Send one step (call after commit) to the control plane's default queue: every step needs the database.
    What a step needs from the node's NVML it asks of the node's agent (reconfiguration.commands)."""
    _send(reconfiguration_step_task, (reconfiguration_id, step), countdown)


@shared_task(name="capacity.tasks.sweep_reconfigurations_task", acks_late=True)
def sweep_reconfigurations_task() -> dict:
    """Beat: give steps of dead workers back (claims whose lease ran out) and re-send lost ones."""
    return sweep()


# --- Drain-and-move (operations/maintenance): the same engine, its own rows and messages ---------------


@shared_task(name="operations.tasks.drain_step_task", bind=True, acks_late=True)
def drain_step_task(self, drain_id: int, step: str) -> str:
    """Run one step of a drain-and-move. Idempotent like reconfiguration_step_task: claimed with a
    conditional UPDATE, re-entered when this same task is redelivered after a worker died."""
    return maintenance.run_step(drain_id, step, token=self.request.id or "local")


def enqueue_drain_step(drain_id: int, step: str, *, countdown: int | None = None) -> None:
    """Send one drain step (call after commit) to the control plane's default queue."""
    _send(drain_step_task, (drain_id, step), countdown)


@shared_task(name="operations.tasks.sweep_drains_task", acks_late=True)
def sweep_drains_task() -> dict:
    """Beat: give drain steps of dead workers back and re-send lost ones."""
    return maintenance.sweep()


# --- Rolling driver upgrades (operations/maintenance/rollout*.py) ---------------------------------------


@shared_task(name="operations.tasks.driver_upgrade_tick_task", bind=True, acks_late=True)
def driver_upgrade_tick_task(self, rollout_id: int) -> str:
    """Drive one rolling driver upgrade: follow its nodes, start or plan a wave, finish. Idempotent: claimed
    with a conditional UPDATE under a lease, re-entered when this same task is redelivered after a worker died."""
    return rollout_tick.tick(rollout_id, token=self.request.id or "local")


def enqueue_driver_upgrade_tick(rollout_id: int, *, countdown: int | None = None) -> None:
    """Send one tick (call after commit) to the control plane's default queue."""
    _send(driver_upgrade_tick_task, (rollout_id,), countdown)


@shared_task(name="operations.tasks.sweep_driver_upgrades_task", acks_late=True)
def sweep_driver_upgrades_task() -> dict:
    """Beat: re-send the tick of a rollout whose worker died or whose message was lost."""
    return rollout_tick.sweep()
