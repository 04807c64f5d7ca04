"""The drain-and-move steps: check, notify, cordon, move, evict, handover, uncordon.

Each takes the NodeDrain and the time and returns Advance or Wait, or raises ReconfigurationError; the
reconfiguration engine claims, runs and records them (operations.reconfiguration.engine.Workflow). Every
step is re-entrant: a redelivered task runs it again over what its first run already did.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from capacity.choices import DrainStep as Step
from capacity.choices import ReconfigurationBackend as Backend
from capacity.choices import ReconfigurationEvent as Event
from capacity.models import USABLE_HEALTH, GpuCapacity, NodeCapacity, NodeDrain
from capacity.services import mig_configs
from operations import signals
from operations.reconfiguration.engine import idle_s
from operations.reconfiguration.outcomes import Advance, ReconfigurationError, Refused, Wait
from operations.reconfiguration.plan import gpu_pods
from operations.reconfiguration.steps import cordon_node, evict_pods, pods_left, uncordon_node
from pools.models import Allocation
from pools.services import move_allocation

from . import upgrades
from .check import take_offline_check
from .records import audit


def evict_timeout_s() -> int:
    """How long after the notice deadline the pods may take to go (PodDisruptionBudgets) before evict fails."""
    return int(getattr(settings, "MAINTENANCE_EVICT_TIMEOUT_S", 900))


def _active_on(drain: NodeDrain):
    return Allocation.objects.active().filter(gpu__node_id=drain.node_id).order_by("pk")


def _node(drain: NodeDrain) -> NodeCapacity:
    node = NodeCapacity.objects.get(pk=drain.node_id)
    if node.is_gone:
        raise ReconfigurationError(f"{node} is gone (discovery no longer sees it)")
    return node


def shortfall_sentence(shortfall: dict[str, int]) -> str:
    return ", ".join(f"{n} x {unit}" for unit, n in shortfall.items())


def step_check(drain: NodeDrain, now: datetime) -> Advance:
    """Refuse, with the shortfall, when the free reserve cannot absorb the node's reservations."""
    node = _node(drain)
    check = take_offline_check(nodes=[node])
    if not check.covered:
        raise Refused(
            f"the free reserve cannot absorb {node}'s reservations: short of {shortfall_sentence(check.shortfall)}",
            {"shortfall": check.shortfall},
        )
    return Advance(
        f"{len(check.hit)} reservation(s) on {node} can move to free equivalent units",
        {"reservations": len(check.hit), "free_elsewhere": check.free_elsewhere},
    )


def step_notify(drain: NodeDrain, now: datetime) -> Advance:
    """Tell each project holding reservations on the node (operations.signals.maintenance_notice) when its
    pods there will be evicted. The deadline is fixed once (a re-run announces the same one)."""
    with transaction.atomic():
        NodeDrain.objects.filter(pk=drain.pk, evict_after__isnull=True).update(
            evict_after=now + timedelta(seconds=drain.grace_s)
        )
        drain.refresh_from_db(fields=["evict_after"])
        by_project: dict[int, list[int]] = defaultdict(list)
        for pk, project_id in _active_on(drain).values_list("pk", "project_id"):
            by_project[project_id].append(pk)
        for project_id, allocation_ids in sorted(by_project.items()):
            signals.maintenance_notice.send(
                sender=NodeDrain,
                drain=drain,
                project_id=project_id,
                allocation_ids=allocation_ids,
                evict_after=drain.evict_after,
                at=now,
            )
    return Advance(
        f"{len(by_project)} project(s) told: pods on {drain.node.name} are evicted from "
        f"{drain.evict_after:%Y-%m-%d %H:%M:%S} UTC",
        {"projects": sorted(by_project), "evict_after": drain.evict_after.isoformat()},
    )


def step_cordon(drain: NodeDrain, now: datetime) -> Advance:
    """Cordon in Kubernetes (no new pod lands there during the grace) and in the inventory at once, so
    approval stops offering the node's units before discovery's next pass mirrors the cordon."""
    result = cordon_node(drain)
    NodeCapacity.objects.filter(pk=drain.node_id).update(cordoned=True)
    return result


def step_move(drain: NodeDrain, now: datetime) -> Advance:
    """Move each active reservation on the node to an equivalent free unit (pools.services.move_allocation:
    approval's locks and choice, the project's other nodes first; quotas and DRA templates reconciled), never
    onto another node of the same upgrade wave (upgrades.wave_siblings).
    Each move commits with its trail row; a re-run moves only what is still on the node."""
    short = []
    moved = 0
    away = {drain.node_id} | upgrades.wave_siblings(drain)
    for allocation in _active_on(drain).select_related("gpu", "project"):
        with transaction.atomic():
            unit = move_allocation(allocation.pk, away_from=away)
            if unit is None:
                short.append(allocation)
                continue
            record = {
                "allocation": allocation.pk,
                "project": allocation.project.slug,
                "from": f"{drain.node.name}/{allocation.gpu.index}",
                "to": f"{unit.node_name}/{GpuCapacity.objects.values_list('index', flat=True).get(pk=unit.gpu_id)}",
            }
            drain.refresh_from_db(fields=["moves"])
            NodeDrain.objects.filter(pk=drain.pk).update(moves=[*drain.moves, record])
            audit(drain, Step.MOVE, Event.INFO, f"allocation #{allocation.pk} moved to {record['to']}", detail=record)
            moved += 1
    if short:
        still_on = [a.pk for a in short]
        shortfall = take_offline_check(nodes=[drain.node_id]).shortfall
        raise ReconfigurationError(
            f"{len(short)} reservation(s) could not move (units taken since the check): short of "
            f"{shortfall_sentence(shortfall) or 'units'}; the node stays cordoned, resume when units are free",
            {"allocations": still_on, "shortfall": shortfall},
        )
    drain.refresh_from_db(fields=["moves"])
    return Advance(f"{moved} reservation(s) moved off {drain.node.name}", {"moved": len(drain.moves)})


def step_evict(drain: NodeDrain, now: datetime) -> Advance | Wait:
    """After the notice deadline, evict the GPU pods left on the node (the reconfiguration drain's
    eviction); fail when they are still there evict_timeout_s() after it (a PodDisruptionBudget)."""
    if drain.evict_after and now < drain.evict_after:
        left = int((drain.evict_after - now).total_seconds()) + 1
        return Wait(
            f"notice runs until {drain.evict_after:%Y-%m-%d %H:%M:%S} UTC; pods are evicted then",
            countdown=min(left, idle_s()),
        )
    with mig_configs.client_for(drain.cluster) as client:
        client.get_node(drain.node.name)
        pods = gpu_pods(client, drain.node, backend=Backend.OPERATOR, affected=[])
        blocked = evict_pods(client, pods)
        evicted = [f"{p.namespace}/{p.name}" for p in pods if not p.deleted]
        if evicted:
            audit(drain, Step.EVICT, Event.INFO, f"evicted {len(evicted)} GPU pod(s)", detail={"evicted": evicted})
        pods = gpu_pods(client, drain.node, backend=Backend.OPERATOR, affected=[])
    if not pods:
        return Advance(f"no GPU pods left on {drain.node.name}: handed over")
    if drain.evict_after and now > drain.evict_after + timedelta(seconds=evict_timeout_s()):
        raise ReconfigurationError(
            f"GPU pods still on {drain.node.name} {evict_timeout_s()} s after the deadline",
            {"pods": [f"{p.namespace}/{p.name}" for p in pods]},
        )
    return pods_left(pods, "evicting", blocked)


def node_health(drain: NodeDrain) -> list[str]:
    """What keeps the node from being given back: not ready in Kubernetes, GPUs missing or unhealthy."""
    problems = []
    with mig_configs.client_for(drain.cluster) as client:
        if not client.get_node(drain.node.name).ready:
            problems.append("the node is not Ready")
    gpus = list(GpuCapacity.objects.present().filter(node_id=drain.node_id).values_list("index", "health"))
    if not gpus:
        problems.append("discovery sees no GPUs on it")
    problems += [f"GPU {i} is {health}" for i, health in gpus if health not in USABLE_HEALTH]
    return problems


def step_handover(drain: NodeDrain, now: datetime) -> Advance | Wait:
    """The node is the operator's (state "in maintenance") until it is given back (lifecycle.give_back) and
    comes back healthy: Ready, every GPU present and healthy. With `driver_upgrade` the GPU Operator's upgrade
    controller has it instead (upgrades.hand_over), and its upgrade-done state gives it back."""
    if drain.give_back_at is None and drain.driver_upgrade:
        waiting = upgrades.hand_over(drain, now)
        if waiting is not None:
            return waiting
        drain.refresh_from_db(fields=["give_back_at"])
    if drain.give_back_at is None:
        return Wait(f"{drain.node.name} handed over: in maintenance until given back", countdown=idle_s())
    problems = node_health(drain)
    if problems:
        return Wait(f"given back; waiting for health: {'; '.join(problems)}", {"problems": problems})
    return Advance(f"{drain.node.name} is back and healthy")


def step_uncordon(drain: NodeDrain, now: datetime) -> Advance:
    """Uncordon (only our own cordon) and give the units back to approval and the queue."""
    result = uncordon_node(drain)
    if drain.was_cordoned is False:
        NodeCapacity.objects.filter(pk=drain.node_id).update(cordoned=False)
    return result


STEPS: dict[str, Callable[[NodeDrain, datetime], Advance | Wait]] = {
    Step.CHECK: step_check,
    Step.NOTIFY: step_notify,
    Step.CORDON: step_cordon,
    Step.MOVE: step_move,
    Step.EVICT: step_evict,
    Step.HANDOVER: step_handover,
    Step.UNCORDON: step_uncordon,
}
