"""Reservations that end for real: an ended allocation's pods leave its unit (docs/pools.md, Ending).

Whatever ends an allocation (release, expiry, a MIG reconfiguration that destroys its instance, an idle
release) sets `released_at`: billing stops there and the allocation is *ending* until no pod of its
project uses the unit any more (`vacated_at`; set at once when the mirror shows none, announce_ending).
While ending, the unit is in capacity's availability as
`Availability.ENDING`: approval, the queue and every screen see it taken, so it is handed to no other
project before it is empty.

The project is told at once (`signals.allocation_ending`, with the time its pods will be
evicted). `sweep_ending()` runs every ALLOCATION_ENDING_SWEEP_S (beat, `sweep_ending_task`) per cluster:

- the pods on each ending unit are read from the workload mirror (capacity's WorkloadProfile: which pod
  runs on which device, however attribution learnt it), never from the cluster by hand;
- a unit with none left is vacated (a conditional UPDATE: repeats and concurrent sweeps are harmless);
- once ALLOCATION_ENDING_GRACE_S has passed since the end, each pod is evicted through the Eviction API
  (policy/v1: a PodDisruptionBudget that blocks answers 429 and the pod is tried again at the next
  sweep); ALLOCATION_ENDING_FORCE_AFTER_S later (the hard deadline) a pod still there is deleted.
  Every attempt is audited (pools.Eviction).

A sweep claims the units it evicts from with a lease (`ending_lease_expires_at`, core.leases): a second
sweep running meanwhile leaves them alone, and a sweep killed half-way leaves a lease that runs out, so the
next beat takes the unit up again. Nothing is kept in the worker: all state is in the rows.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from capacity.adapters.kubernetes import KubernetesClient, KubernetesError, NotFound, TooManyRequests
from capacity.choices import SpecKind
from capacity.models import Cluster, WorkloadProfile
from core.leases import lease_until
from policies import policy

from .choices import EvictionOutcome
from .models import Allocation, Eviction
from .signals import allocation_ending

logger = logging.getLogger(__name__)

Pod = tuple[str, str]  # (namespace, name)


def grace() -> timedelta:
    return timedelta(seconds=policy("ALLOCATION_ENDING_GRACE_S"))


def hard_deadline() -> timedelta:
    """From the end to the forced delete: the grace period, then ALLOCATION_ENDING_FORCE_AFTER_S more."""
    return grace() + timedelta(seconds=policy("ALLOCATION_ENDING_FORCE_AFTER_S"))


def announce_ending(allocation_ids, *, reason: str, at: datetime) -> None:
    """Start the ending of these just-ended allocations: a unit no pod of its project uses (by the workload
    mirror) is vacated at once, the others stay ending for the sweep; and tell each project
    (signals.allocation_ending, one signal per project). Call inside the transaction that set released_at:
    receivers enqueue their work on commit (pools.signals)."""
    ids = sorted(set(allocation_ids))
    if not ids:
        return
    ended = list(Allocation.objects.ending().filter(pk__in=ids).select_related("gpu__node").order_by("pk"))
    pods = pods_on_ending_units(ended)
    empty = [a.pk for a in ended if not pods[a.pk]]
    if empty:
        Allocation.objects.ending().filter(pk__in=empty).update(vacated_at=at)
    by_project: dict[int, list[int]] = defaultdict(list)
    for pk, project_id in Allocation.objects.filter(pk__in=ids).values_list("pk", "project_id").order_by("pk"):
        by_project[project_id].append(pk)

    for project_id, allocations in sorted(by_project.items()):
        allocation_ending.send(
            sender=Allocation,
            project_id=project_id,
            allocation_ids=allocations,
            reason=reason,
            at=at,
            evict_after=at + grace(),
            force_after=at + hard_deadline(),
        )


def pods_on_ending_units(allocations: list[Allocation]) -> dict[int, list[Pod]]:
    """{allocation id: pods of its project still on its unit}, from the workload mirror. Two queries.

    A MIG instance or a whole GPU: the project's pods the mirror places on that device. A time-slice replica
    (or a vGPU) has no device of its own, and a pod whose device is not known yet has only its node and
    resource: there the project's pods beyond what it still holds (its active allocations on that GPU, or on
    that node for that resource) belong to its ending units, which share them (each is vacated when none is left).
    """
    if not allocations:
        return {}
    projects = {a.project_id for a in allocations}
    gpus = {a.gpu_id for a in allocations}
    nodes = {a.gpu.node_id for a in allocations}
    running = (
        WorkloadProfile.objects.running()
        .filter(project_id__in=projects)
        .filter(Q(gpu_id__in=gpus) | Q(gpu__isnull=True, node_id__in=nodes))
        .order_by("namespace", "pod_name")
        .values_list(
            "namespace", "pod_name", "gpu_id", "mig_instance_id", "node_id", "resource_name", "count", "project_id"
        )
    )
    by_device: dict[tuple, list[Pod]] = defaultdict(list)
    shared: dict[tuple, list[tuple[Pod, int]]] = defaultdict(list)
    for namespace, name, gpu_id, mig_id, node_id, resource, count, project_id in running:
        if gpu_id is None:
            shared[("node", project_id, node_id, resource)].append(((namespace, name), count))
        elif mig_id is not None:
            by_device[("mig", project_id, mig_id)].append((namespace, name))
        else:
            by_device[("gpu", project_id, gpu_id)].append((namespace, name))
            shared[("gpu", project_id, gpu_id)].append(((namespace, name), count))
    held = _still_held(allocations)
    result: dict[int, list[Pod]] = {}
    for a in allocations:
        pods: list[Pod] = []
        if a.kind == SpecKind.MIG:
            pods += by_device.get(("mig", a.project_id, a.mig_instance_id), [])
        elif a.kind == SpecKind.FULL:
            pods += by_device.get(("gpu", a.project_id, a.gpu_id), [])
        else:
            key = ("gpu", a.project_id, a.gpu_id)
            pods += _beyond(shared.get(key, []), held.get(key, 0))
        key = ("node", a.project_id, a.gpu.node_id, a.resource_name)
        pods += _beyond(shared.get(key, []), held.get(key, 0))
        result[a.pk] = list(dict.fromkeys(pods))
    return result


def _still_held(allocations: list[Allocation]) -> dict[tuple, int]:
    """The projects' active units per (project, GPU) (whole-GPU side) and per (project, node, resource)."""
    active = Allocation.objects.active().filter(
        project_id__in={a.project_id for a in allocations}, gpu__node_id__in={a.gpu.node_id for a in allocations}
    )
    held: dict[tuple, int] = defaultdict(int)
    rows = active.values_list("project_id", "gpu_id", "gpu__node_id", "resource_name", "mig_instance_id")
    for project_id, gpu_id, node_id, resource, mig_id in rows.order_by():
        if mig_id is None:
            held[("gpu", project_id, gpu_id)] += 1
        held[("node", project_id, node_id, resource)] += 1
    return held


def _beyond(pods: list[tuple[Pod, int]], held: int) -> list[Pod]:
    """The pods beyond the first `held` units they use (by name order): those no active unit covers."""
    covered, out = 0, []
    for pod, count in pods:
        if covered + count <= held:
            covered += count
            continue
        out.append(pod)
    return out


@dataclass
class EndingResult:
    vacated: int = 0
    evicted: int = 0
    blocked: int = 0
    forced: int = 0
    gone: int = 0
    waiting: int = 0
    failed: int = 0
    outcomes: list[tuple[str, str, str]] = field(default_factory=list)  # (namespace, pod, outcome)

    def summary(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("vacated", "evicted", "blocked", "forced", "gone", "waiting", "failed")}


def evict(
    kube: KubernetesClient,
    pod: Pod,
    *,
    force: bool,
    reason: str,
    allocation: Allocation | None = None,
    loan=None,
    project_id: int | None = None,
    at: datetime,
) -> str:
    """Take one pod off a unit that is no longer its project's, and audit it (pools.Eviction): the Eviction
    API (a 429 from a PodDisruptionBudget is `blocked`), or, when `force`, the Eviction API first and a
    delete if a budget blocks it. Returns the EvictionOutcome. Raises KubernetesError when the cluster
    cannot be reached (nothing is audited then: the next sweep tries again)."""
    namespace, name = pod
    detail = ""
    try:
        kube.evict_pod(namespace, name)
        outcome = EvictionOutcome.EVICTED
    except NotFound:
        outcome = EvictionOutcome.GONE
    except TooManyRequests as exc:  # a PodDisruptionBudget blocks it now (the Eviction API's 429)
        detail = str(exc)[:500]
        outcome = EvictionOutcome.BLOCKED
        if force:
            try:
                kube.delete_pod(namespace, name, grace_period_s=0)
                outcome = EvictionOutcome.FORCED
            except NotFound:
                outcome = EvictionOutcome.GONE
    Eviction.objects.create(
        allocation=allocation,
        loan=loan,
        project_id=project_id,
        namespace=namespace,
        pod_name=name,
        outcome=outcome,
        reason=reason[:300],
        detail=detail,
        at=at,
    )
    return outcome


def _claim(allocation_ids: list[int], now: datetime) -> list[int]:
    """Take the lease on these ending units; returns those claimed (another sweep holds the rest)."""
    claimed = []
    for pk in allocation_ids:
        free = Q(ending_lease_expires_at__isnull=True) | Q(ending_lease_expires_at__lte=now)
        if Allocation.objects.ending().filter(free, pk=pk).update(ending_lease_expires_at=lease_until(now)) == 1:
            claimed.append(pk)
    return claimed


def sweep_ending(
    cluster: Cluster, *, now: datetime | None = None, client_factory=KubernetesClient.for_cluster
) -> EndingResult:
    """One pass over the ending allocations on `cluster` (see the module docstring). Idempotent."""
    now = now or timezone.now()
    result = EndingResult()
    ending = list(
        Allocation.objects.ending()
        .filter(gpu__node__cluster=cluster)
        .select_related("gpu__node", "pool")
        .order_by("pk")
    )
    if not ending:
        return result
    pods = pods_on_ending_units(ending)
    empty = [a.pk for a in ending if not pods[a.pk]]
    if empty:
        result.vacated = (
            Allocation.objects.ending().filter(pk__in=empty).update(vacated_at=now, ending_lease_expires_at=None)
        )
    due = [a for a in ending if pods[a.pk] and a.released_at + grace() <= now]
    result.waiting = sum(1 for a in ending if pods[a.pk] and a.released_at + grace() > now)
    claimed = set(_claim([a.pk for a in due], now))
    if not claimed:
        return result
    done: set[Pod] = set()
    try:
        with client_factory(cluster) as kube:
            for a in due:
                if a.pk not in claimed:
                    continue
                force = a.released_at + hard_deadline() <= now
                why = a.end_reason or a.pool.state_reason or "the reservation ended"
                reason = f"allocation #{a.pk} ended {a.released_at:%Y-%m-%d %H:%M:%S} UTC ({why})"
                for pod in pods[a.pk]:
                    if pod in done:
                        continue
                    done.add(pod)
                    outcome = evict(
                        kube, pod, force=force, reason=reason, allocation=a, project_id=a.project_id, at=now
                    )
                    result.outcomes.append((*pod, outcome))
                    if outcome == EvictionOutcome.BLOCKED:
                        result.blocked += 1
                    elif outcome == EvictionOutcome.FORCED:
                        result.forced += 1
                    elif outcome == EvictionOutcome.GONE:
                        result.gone += 1
                    else:
                        result.evicted += 1
    except KubernetesError:
        result.failed += 1
        logger.warning("ending sweep on %s could not reach the cluster; the next sweep retries", cluster, exc_info=True)
    finally:
        Allocation.objects.filter(pk__in=claimed).update(ending_lease_expires_at=None)
    return result
