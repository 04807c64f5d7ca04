"""The engine: claim a step, run it under a lease, record what happened and send the next one.

run_step() is what the step task calls; sweep() is what beat calls to recover lost work. Both drive
MIG reconfigurations; run_workflow_step() and sweep_workflow() drive any Workflow: a tracked row with the
same claim, lease and step fields (MigReconfiguration, NodeDrain) and its own steps, trail and queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.choices import ReconfigurationEvent as Event
from capacity.choices import ReconfigurationState as State
from capacity.choices import ReconfigurationStep as Step
from capacity.models import MigReconfiguration
from core.leases import Heartbeat, crash_point, give_back_lapsed, lease_s, lease_until
from pools.services import enqueue_queue_processing

from .outcomes import Advance, ReconfigurationError, Wait
from .records import audit, enqueue, stamp
from .steps import STEPS

logger = logging.getLogger(__name__)

ORDER = [Step.PLAN, Step.CHECK, Step.CORDON, Step.DRAIN, Step.APPLY, Step.VERIFY, Step.UNCORDON, Step.DONE]


@dataclass(frozen=True)
class Workflow:
    """One kind of workflow the engine runs. `model` is a core.leases.LeasedStep whose rows also carry step,
    state, failed_step, error, finished_at, updated_at, the
    STEP_TIMESTAMPS map, a `steps` trail (step, event, message, at) and objects.stale(now)."""

    name: str  # crash points and logs
    model: Any
    steps: Mapping[str, Callable]  # step -> fn(row, now) -> Advance | Wait (raises ReconfigurationError)
    order: Sequence[str]  # ends with the resting step ("done")
    audit: Callable  # audit(row, step, event, message, detail=, task_id=)
    enqueue: Callable  # enqueue(row, step, countdown=) after commit
    timeout_s: Callable[[str], int | None]
    related: tuple[str, ...] = ("cluster", "node")
    on_done: Callable[[Any], None] | None = None


def _setting(name: str, default: int) -> int:
    return int(getattr(settings, name, default))


def poll_interval_s() -> int:
    """Countdown of a waiting step's next check; keep it far below the Redis visibility timeout."""
    return _setting("MIG_RECONFIG_POLL_S", 5)


def step_timeout_s(step: str) -> int | None:
    return {
        Step.DRAIN: _setting("MIG_DRAIN_TIMEOUT_S", 900),
        Step.APPLY: _setting("MIG_APPLY_TIMEOUT_S", 1200),
        Step.VERIFY: _setting("MIG_VERIFY_TIMEOUT_S", 300),
    }.get(step)


def idle_s() -> int:
    """A pending or waiting step nobody touched for this long lost its message: sweep() re-sends it."""
    return lease_s() + poll_interval_s()


def run_step(reconf_id: int, step: str, *, token: str, now: datetime | None = None) -> str:
    """Claim `step` of the MIG reconfiguration and run it once (run_workflow_step)."""
    return run_workflow_step(MIG, reconf_id, step, token=token, now=now)


def run_workflow_step(flow: Workflow, reconf_id: int, step: str, *, token: str, now: datetime | None = None) -> str:
    """Claim `step` of the workflow's row and run it once; returns what happened.

    "gone" (no such row), "stale" (the reconfiguration is at another step or closed), "busy"
    (another task holds the claim), "advanced", "waiting", "failed". Safe to call again with the
    same token after an interruption: the claim is re-taken and the step re-entered.
    """
    now = now or timezone.now()
    row = flow.model.objects.filter(pk=reconf_id).values("step", "state", "claim_token").first()
    if row is None:
        return "gone"
    if row["step"] != step:
        return "stale"
    if row["state"] in (State.PENDING, State.WAITING):
        condition = Q(state=row["state"])
    elif row["state"] == State.RUNNING and row["claim_token"] == token:
        condition = Q(state=State.RUNNING, claim_token=token)
    elif row["state"] == State.RUNNING:
        return "busy"
    else:
        return "stale"
    claimed = flow.model.objects.filter(condition, pk=reconf_id, step=step).update(
        **stamp(
            state=State.RUNNING, claim_token=token, claimed_at=now, task_id=token[:64], lease_expires_at=lease_until()
        )
    )
    if claimed != 1:
        return "busy"
    timeout = flow.timeout_s(step)
    if timeout is not None:
        flow.model.objects.filter(pk=reconf_id, step_deadline__isnull=True).update(
            step_deadline=now + timedelta(seconds=timeout)
        )
    reconf = flow.model.objects.select_related(*flow.related).get(pk=reconf_id)
    if row["state"] == State.PENDING:
        flow.audit(reconf, step, Event.STARTED, task_id=token)
    elif row["state"] == State.RUNNING:
        flow.audit(reconf, step, Event.INFO, "re-entered after an interrupted run (task redelivered)", task_id=token)

    try:
        with Heartbeat(_owned(flow, reconf, step, token)):
            result = flow.steps[step](reconf, now)
        crash_point(f"{flow.name}.{step}")  # fault suite: the step's work is done, not yet recorded
    except ReconfigurationError as exc:
        return _fail(flow, reconf, step, token, str(exc), exc.detail)
    except kube.NotFound as exc:
        gone = f"{reconf.node.name} or an object it needs is gone from the cluster: {exc}"
        return _fail(flow, reconf, step, token, gone)
    except kube.KubernetesError as exc:
        return _fail(flow, reconf, step, token, f"Kubernetes: {type(exc).__name__}: {exc}")
    except Exception as exc:  # a bug or an outside error: stop visibly, never half-silently
        logger.exception("%s #%s step %s failed", flow.name, reconf_id, step)
        return _fail(flow, reconf, step, token, f"{type(exc).__name__}: {exc}")

    if isinstance(result, Wait):
        return _wait(flow, reconf, step, token, result, now)
    return _advance(flow, reconf, step, token, result, now)


def _owned(flow: Workflow, reconf, step, token):
    return reconf.owned(token, step=step, state=State.RUNNING)


def _advance(flow: Workflow, reconf, step, token, result: Advance, now) -> str:
    following = result.jump or flow.order[list(flow.order).index(step) + 1]
    done = following == flow.order[-1]
    fields = flow.model.released(
        **{
            flow.model.STEP_TIMESTAMPS[step]: now,
            "step": following,
            "state": State.SUCCEEDED if done else State.PENDING,
            "step_deadline": None,
            **result.updates,
        }
    )
    if done:
        fields["finished_at"] = now
    with transaction.atomic():
        if _owned(flow, reconf, step, token).update(**stamp(**fields)) != 1:
            return "busy"
        detail = dict(result.detail)
        if result.jump:
            detail["jump_to"] = result.jump
        flow.audit(reconf, step, Event.COMPLETED, result.message, detail=detail, task_id=token)
        if not done:
            flow.enqueue(reconf, following)
        elif flow.on_done is not None:
            flow.on_done(reconf)
    return "advanced"


def _wait(flow: Workflow, reconf, step, token, result: Wait, now) -> str:
    reconf.refresh_from_db(fields=["step_deadline"])
    deadline = reconf.step_deadline
    if deadline is not None and now >= deadline:
        return _fail(
            flow, reconf, step, token, f"timed out after {flow.timeout_s(step)} s: {result.message}", result.detail
        )
    with transaction.atomic():
        owned = _owned(flow, reconf, step, token)
        if owned.update(**stamp(**flow.model.released(state=State.WAITING))) != 1:
            return "busy"
        last = reconf.steps.filter(step=step).order_by("-at", "-id").first()
        if last is None or last.event != Event.WAITING or last.message != result.message:
            flow.audit(reconf, step, Event.WAITING, result.message, detail=result.detail, task_id=token)
        flow.enqueue(reconf, step, countdown=result.countdown or poll_interval_s())
    return "waiting"


def _fail(flow: Workflow, reconf, step, token, message: str, detail: dict | None = None) -> str:
    with transaction.atomic():
        if (
            _owned(flow, reconf, step, token).update(
                **stamp(**flow.model.released(state=State.FAILED, failed_step=step, error=message))
            )
            != 1
        ):
            return "busy"
        flow.audit(reconf, step, Event.FAILED, message, detail=detail, task_id=token)
    logger.warning("%s #%s failed at %s: %s", flow.name, reconf.pk, step, message)
    return "failed"


# --- Sweeping lost work ----------------------------------------------------------------------


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Recover lost MIG reconfiguration work (sweep_workflow)."""
    return sweep_workflow(MIG, now)


def sweep_workflow(flow: Workflow, now: datetime | None = None) -> dict[str, int]:
    """Recover lost work (beat, every MIG_RECONFIG_SWEEP_S): a running step whose lease ran out
    belongs to a dead worker and goes back to pending; a pending or waiting step nobody touched for
    idle_s() (its message was lost, or its worker died before claiming) is enqueued again. Each
    recovery is claimed with a conditional UPDATE (two sweeps never both re-send a step), and a
    duplicate message is harmless anyway: the step's claim lets one through.
    Recovery takes at most WORKFLOW_LEASE_S + MIG_RECONFIG_SWEEP_S after the worker's last heartbeat."""
    now = now or timezone.now()

    def requeue(reconf) -> None:
        lost = f"worker lost (claim {reconf.claim_token or '-'} expired); step re-queued"
        flow.audit(reconf, reconf.step, Event.INFO, lost)
        flow.enqueue(reconf, reconf.step)

    stale = len(
        give_back_lapsed(
            flow.model.objects.stale(now).select_related(*flow.related),
            lambda: stamp(**flow.model.released(state=State.PENDING)),
            requeue,
            state=State.RUNNING,
        )
    )
    idle_before = now - timedelta(seconds=idle_s())
    requeued = 0
    for reconf in flow.model.objects.filter(
        state__in=[State.PENDING, State.WAITING], updated_at__lt=idle_before
    ).select_related(*flow.related):
        with transaction.atomic():
            # Stamping updated_at claims the re-send and spaces the next one by idle_s().
            if flow.model.objects.filter(
                pk=reconf.pk, state=reconf.state, step=reconf.step, updated_at=reconf.updated_at
            ).update(updated_at=now):
                flow.enqueue(reconf, reconf.step)
                requeued += 1
    if stale or requeued:
        logger.info("%s sweep: %d dead workers' steps re-queued, %d lost messages re-sent", flow.name, stale, requeued)
    return {"stale_claims": stale, "requeued": requeued}


MIG = Workflow(
    name="reconfiguration",
    model=MigReconfiguration,
    steps=STEPS,
    order=ORDER,
    audit=audit,
    enqueue=enqueue,
    timeout_s=step_timeout_s,
    related=("cluster", "node", "layout"),
    on_done=lambda reconf: enqueue_queue_processing(),  # the new layout's units: offer them to the queue
)
