"""The tick that drives a rolling driver upgrade (rollout.py), and the sweep that recovers it.

One tick, claimed by one worker (a conditional UPDATE on claim_token, a lease renewed by a heartbeat as in
the reconfiguration engine), re-reads everything and does what is due, so that running it again after a
worker died anywhere repeats nothing:

    follow  each started node from its drain: draining -> upgrading (handed over) -> done (the drain
            succeeded: upgraded, given back, healthy, uncordoned); failed when the controller says
            upgrade-failed, when the drain failed, or when it is not back DRIVER_UPGRADE_TIMEOUT_S after
            it was handed over. A failed node stays cordoned in maintenance (its drain stays open), its
            reservations are already elsewhere, and the rollout goes on with the others.
    start   the current wave's planned nodes not started yet: one drain each (lifecycle.start), the
            drain and the node's row written in one transaction (a node is never drained twice).
    plan    when no node is out: the next wave (upgrades.next_wave over the pending nodes whose
            maintenance window is open now), recorded before any drain starts.
    finish  when no node is left: succeeded, or failed naming the failed nodes.

A paused or cancelled rollout only follows. Each tick ends by sending the next one (DRIVER_UPGRADE_POLL_S);
a message arriving before tick_due_at is a duplicate and does nothing. sweep() (beat) gives back the claim
of a dead worker and re-sends a tick nobody ran for lease + poll seconds.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from capacity.choices import DrainStep
from capacity.choices import ReconfigurationState as DrainState
from capacity.models import MaintenanceWindow
from core.leases import Heartbeat, crash_point, give_back_lapsed, lease_s
from operations.choices import UpgradeMode, UpgradeNodeState, UpgradeState
from operations.models import IN_FLIGHT, DriverUpgrade, DriverUpgradeNode
from operations.reconfiguration.outcomes import IllegalTransition, Refused

from .lifecycle import start
from .upgrades import next_wave

logger = logging.getLogger(__name__)
Node = UpgradeNodeState


def poll_s() -> int:
    return int(getattr(settings, "DRIVER_UPGRADE_POLL_S", 30))


def timeout_s() -> int:
    return int(getattr(settings, "DRIVER_UPGRADE_TIMEOUT_S", 7200))


def tick(rollout_id: int, *, token: str, now: datetime | None = None) -> str:
    """Claim the rollout and do what is due (module docstring). Returns "gone", "done" (nothing to follow),
    "early" (a duplicate message), "busy" (another worker holds it), or what the tick did."""
    from operations.tasks import enqueue_driver_upgrade_tick  # cycle: operations.tasks imports this package

    now = now or timezone.now()
    row = DriverUpgrade.objects.filter(pk=rollout_id).values("claim_token", "tick_due_at").first()
    if row is None:
        return "gone"
    if row["claim_token"] != token and row["tick_due_at"] and now < row["tick_due_at"] - timedelta(seconds=1):
        return "early"
    if DriverUpgrade.objects.to_tick().filter(pk=rollout_id).claim(token, now) != 1:
        return "done" if not DriverUpgrade.objects.to_tick().filter(pk=rollout_id).exists() else "busy"
    owned = DriverUpgrade.objects.filter(pk=rollout_id, claim_token=token[:64])
    with Heartbeat(owned):
        rollout = DriverUpgrade.objects.select_related("cluster").get(pk=rollout_id)
        outcome = advance(rollout, now)
    with transaction.atomic():
        following = DriverUpgrade.objects.to_tick().filter(pk=rollout_id).exists()
        due = now + timedelta(seconds=poll_s())
        owned.update(**DriverUpgrade.released(tick_due_at=due if following else None))
        if following:
            transaction.on_commit(lambda: enqueue_driver_upgrade_tick(rollout_id, countdown=poll_s()))
    return outcome


def advance(rollout: DriverUpgrade, now: datetime) -> str:
    """follow, then (running only) start / plan / finish; what it did, in words."""
    follow(rollout, now)
    crash_point("upgrade.follow")
    if rollout.state == UpgradeState.PENDING:
        DriverUpgrade.objects.filter(pk=rollout.pk, state=UpgradeState.PENDING).update(
            state=UpgradeState.RUNNING, started_at=now
        )
        rollout.refresh_from_db()
    nodes = rollout.nodes
    if rollout.state != UpgradeState.RUNNING:
        if rollout.state == UpgradeState.CANCELLED and not nodes.filter(state__in=IN_FLIGHT).exists():
            DriverUpgrade.objects.filter(pk=rollout.pk, finished_at__isnull=True).update(finished_at=now)
        return f"following ({rollout.state})"
    started = start_planned(rollout, now)
    if nodes.filter(state__in=IN_FLIGHT).exists():
        return f"wave {rollout.current_wave}: started {started}" if started else f"wave {rollout.current_wave} out"
    if nodes.filter(state=Node.PENDING).exists():
        planned = plan_wave(rollout, now)
        if planned:
            return f"wave {rollout.current_wave}: started {start_planned(rollout, now)} of {planned}"
        return "waiting"
    finish(rollout, now)
    return rollout.state


def _set(row: DriverUpgradeNode, old: str, new: str, now: datetime, error: str = "") -> None:
    stamp = {Node.UPGRADING: "upgrading_at", Node.DONE: "done_at", Node.FAILED: "failed_at"}[new]
    fields = {"state": new, stamp: now}
    if new == Node.DONE and row.upgrading_at is None:
        fields["upgrading_at"] = now
    if error:
        fields["error"] = error
    DriverUpgradeNode.objects.filter(pk=row.pk, state=old).update(**fields)


def follow(rollout: DriverUpgrade, now: datetime) -> None:
    """Each started node's progress, from its drain (module docstring)."""
    rows = DriverUpgradeNode.objects.filter(rollout=rollout, state__in=IN_FLIGHT).select_related("drain", "node")
    for row in rows.order_by("position", "id"):
        drain = row.drain
        if drain.state == DrainState.SUCCEEDED:
            _set(row, row.state, Node.DONE, now)
        elif drain.state in (DrainState.FAILED, DrainState.CANCELLED, DrainState.ROLLED_BACK):
            _set(row, row.state, Node.FAILED, now, f"drain #{drain.pk} {drain.state} at {drain.step}: {drain.error}")
        elif row.state == Node.DRAINING and drain.step in (DrainStep.HANDOVER, DrainStep.UNCORDON):
            _set(row, Node.DRAINING, Node.UPGRADING, now)
        elif row.state == Node.UPGRADING:
            if drain.steps.filter(step=DrainStep.HANDOVER, detail__upgrade_failed=True).exists():
                _set(row, Node.UPGRADING, Node.FAILED, now, "the new driver failed validation (upgrade-failed)")
            elif row.upgrading_at and now > row.upgrading_at + timedelta(seconds=timeout_s()):
                waited = "upgrade-done" if rollout.mode == UpgradeMode.CONTROLLER else "given back healthy"
                _set(row, Node.UPGRADING, Node.FAILED, now, f"never came back: not {waited} within {timeout_s()} s")


def _open_groups(rollout: DriverUpgrade, pending, now: datetime) -> tuple[set[str], datetime | None]:
    """Node groups (of the pending nodes) with a maintenance window open at `now`, and the earliest next
    opening among the others (MaintenanceWindow.objects.for_node(node).open_at(now), once per group)."""
    open_groups, next_at = set(), None
    sample = {}
    for row in pending:
        sample.setdefault(row.node.node_group, row.node)
    for group, node in sample.items():
        windows = list(MaintenanceWindow.objects.for_node(node))
        if [w for w in windows if w.is_open(now)]:
            open_groups.add(group)
            continue
        for w in windows:
            opening = w.next_opening(now)
            if opening and (next_at is None or opening[0] < next_at):
                next_at = opening[0]
    return open_groups, next_at


def plan_wave(rollout: DriverUpgrade, now: datetime) -> int:
    """Record the next wave (current_wave + 1 on its nodes) or why none can start; the number planned."""
    pending = list(
        DriverUpgradeNode.objects.filter(rollout=rollout, state=Node.PENDING, wave__isnull=True)
        .select_related("node")
        .order_by("position", "id")
    )
    open_groups, next_at = _open_groups(rollout, pending, now)
    candidates = [r.node for r in pending if r.node.node_group in open_groups]
    if not candidates:
        return _waiting(rollout, "no maintenance window is open for the remaining nodes", next_at)
    wave = next_wave(candidates, max_parallel=rollout.max_parallel)
    if not wave:
        return _waiting(rollout, "the free reserve cannot absorb any remaining node's reservations now", next_at)
    number = rollout.current_wave + 1
    with transaction.atomic():
        if not DriverUpgrade.objects.filter(pk=rollout.pk, current_wave=rollout.current_wave).update(
            current_wave=number, waiting_for="", next_window_at=next_at
        ):
            return 0
        DriverUpgradeNode.objects.filter(rollout=rollout, node__in=wave, state=Node.PENDING).update(wave=number)
    crash_point("upgrade.plan_wave")
    rollout.refresh_from_db()
    return len(wave)


def _waiting(rollout: DriverUpgrade, why: str, next_at) -> int:
    DriverUpgrade.objects.filter(pk=rollout.pk).update(waiting_for=why[:300], next_window_at=next_at)
    return 0


def start_planned(rollout: DriverUpgrade, now: datetime) -> int:
    """Start a drain for each planned node of the current wave not started yet; the number started.

    The drain and the node's row commit together. A node the reserve cannot absorb any more (Refused) goes
    back to the pending nodes; one that already has an open drain (someone else's) is marked failed."""
    planned = DriverUpgradeNode.objects.filter(
        rollout=rollout, wave=rollout.current_wave, state=Node.PENDING, drain__isnull=True
    ).select_related("node")
    started = 0
    for row in planned.order_by("position", "id"):
        try:
            with transaction.atomic():
                drain = start(
                    row.node,
                    reason=f"driver upgrade #{rollout.pk}" + (f" ({rollout.name})" if rollout.name else ""),
                    grace_s=rollout.grace_s,
                    driver_upgrade=rollout.mode == UpgradeMode.CONTROLLER,
                )
                DriverUpgradeNode.objects.filter(pk=row.pk, state=Node.PENDING, drain__isnull=True).update(
                    drain=drain, state=Node.DRAINING, draining_at=now
                )
        except Refused as exc:
            DriverUpgradeNode.objects.filter(pk=row.pk, state=Node.PENDING).update(wave=None)
            DriverUpgrade.objects.filter(pk=rollout.pk).update(waiting_for=str(exc)[:300])
            continue
        except IllegalTransition as exc:
            _set(row, Node.PENDING, Node.FAILED, now, str(exc))
            continue
        crash_point("upgrade.start_drain")
        started += 1
    return started


def finish(rollout: DriverUpgrade, now: datetime) -> None:
    failed = list(
        DriverUpgradeNode.objects.filter(rollout=rollout, state=Node.FAILED)
        .order_by("position")
        .values_list("node__name", flat=True)
    )
    state = UpgradeState.FAILED if failed else UpgradeState.SUCCEEDED
    error = f"{len(failed)} node(s) failed: {', '.join(failed)}" if failed else ""
    DriverUpgrade.objects.filter(pk=rollout.pk, state=UpgradeState.RUNNING).update(
        state=state, finished_at=now, error=error, waiting_for=""
    )
    rollout.refresh_from_db()


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Beat: a claim whose lease ran out belongs to a dead worker (cleared and due at once, tick re-sent); a
    rollout whose tick is overdue by lease + poll seconds (or due at once and not run by the next sweep) lost its
    message (re-sent, due stamped now). Each claimed by a conditional UPDATE, so two sweeps never both send."""
    from operations.tasks import enqueue_driver_upgrade_tick  # cycle: operations.tasks imports this package

    now = now or timezone.now()
    requeued = 0
    live = DriverUpgrade.objects.to_tick()
    resent = [
        rollout.pk
        for rollout in give_back_lapsed(
            live.held().lease_ran_out(now).only("pk", "claim_token"),
            lambda: DriverUpgrade.released(tick_due_at=None),
            lambda rollout: transaction.on_commit(lambda pk=rollout.pk: enqueue_driver_upgrade_tick(pk)),
        )
    ]
    stale = len(resent)
    overdue = now - timedelta(seconds=lease_s() + poll_s())
    lost = live.filter(Q(tick_due_at__lt=overdue) | Q(tick_due_at__isnull=True), claim_token="")
    for pk, due in lost.exclude(pk__in=resent).values_list("pk", "tick_due_at"):
        with transaction.atomic():
            if DriverUpgrade.objects.filter(pk=pk, claim_token="", tick_due_at=due).update(tick_due_at=now):
                transaction.on_commit(lambda pk=pk: enqueue_driver_upgrade_tick(pk))
                requeued += 1
    if stale or requeued:
        logger.info("driver upgrade sweep: %d dead workers' ticks re-sent, %d lost ticks re-sent", stale, requeued)
    return {"stale_claims": stale, "requeued": requeued}
