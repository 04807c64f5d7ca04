"""Lending a pool's idle units to other projects, and taking them back (docs/queue.md, Borrowing).

The lender keeps its allocation throughout: a loan only adds the unit to the borrower's grant
(device plugin: its quota and the node's project label; DRA: a claim template admitting the lent
UUID), for pods of the low PriorityClass `gpuaas-borrowed`. When the lender needs the unit (a pod of
its namespace Pending for the unit's resource, or the lender asks), the loan goes to `reclaiming`:
the borrower's grant shrinks at once (no new pods), and after LENDING_RECLAIM_GRACE_S its pods on
the unit's node are evicted through the Eviction API and the loan ends. `reconcile_loans()` drives
this from the beat; every step is a conditional UPDATE, so repeated or concurrent runs are harmless.
Which units to lend (idle data) is decided by monitoring (monitoring/services/lending.py).

A loan serves a queued PoolRequest (`borrower_request`) or a BestEffortRequest (`best_effort`). When a
queued borrower leaves the queue (approved onto its own units, rejected, withdrawn) its loans end in the
same transaction (end_request_loans, called by services.transition). QueueEntry.running_on_loan_since says
whether open loans cover a queued request's whole count; refresh_on_loan() keeps it true wherever loans
are made or end.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from capacity.adapters.kubernetes import KubernetesClient, KubernetesError, NotFound
from capacity.models import Cluster, WorkloadProfile
from policies import policy
from tenancy.models import Project

from .choices import BestEffortState, LoanState, RequestState
from .ending import evict
from .exceptions import LendingRefused
from .models import Allocation, BestEffortRequest, Loan, PoolRequest, QueueEntry
from .provisioning import BORROWED_PRIORITY_CLASS, reconcile
from .signals import loan_reclaimed

logger = logging.getLogger(__name__)


def lend(
    allocation: Allocation,
    borrower: Project,
    *,
    request: PoolRequest | None = None,
    best_effort: BestEffortRequest | None = None,
    at: datetime | None = None,
) -> Loan:
    """Lend one active unit to `borrower`, for its queued `request` or its `best_effort` request (or neither);
    the borrower's grant is reconciled after commit.

    Refused (LendingRefused) when the pool opted out, the unit is released or already lent, the borrower
    is the lender, or the request it serves is no longer waiting (queued) or open. The partial unique
    constraint makes a double loan impossible: a concurrent lend of the same unit is refused too. The
    served request's row is locked (SELECT ... FOR UPDATE) while the loan is made, so a concurrent
    approval either ends this loan (it commits after) or is seen here (the lend is refused).
    """
    from .tasks import reconcile_project_task  # cycle: pools.tasks imports provisioning

    pool = allocation.pool
    if not pool.lending_enabled:
        raise LendingRefused(f"pool {pool} does not lend its units (lending_enabled is off)")
    if allocation.released_at is not None or pool.released_at is not None:
        raise LendingRefused("a released unit cannot be lent")
    if borrower.pk == pool.project_id:
        raise LendingRefused("a project cannot borrow its own units")
    try:
        with transaction.atomic():
            _lock_served(request, best_effort)
            loan = Loan.objects.create(
                allocation=allocation,
                lender_pool=pool,
                borrower=borrower,
                borrower_request=request,
                best_effort=best_effort,
                started_at=at or timezone.now(),
            )
            reconcile_project_task.delay_on_commit(borrower.pk, Allocation.objects.cluster_id_of(allocation.pk))
    except IntegrityError:  # pools_loan_unique_open_allocation
        raise LendingRefused(f"{allocation} is already lent") from None
    return loan


def _lock_served(request: PoolRequest | None, best_effort: BestEffortRequest | None) -> None:
    if request is not None and not (
        PoolRequest.objects.select_for_update().filter(pk=request.pk, state=RequestState.QUEUED).exists()
    ):
        raise LendingRefused(f"pool request #{request.pk} is not waiting in the queue")
    if best_effort is not None and not (
        BestEffortRequest.objects.select_for_update().filter(pk=best_effort.pk, state=BestEffortState.OPEN).exists()
    ):
        raise LendingRefused(f"best-effort request #{best_effort.pk} has ended")


def request_reclaim(loan: Loan, *, reason: str, at: datetime | None = None) -> bool:
    """The lender needs the unit: start the grace period; the borrower's grant shrinks after commit.
    False when the loan is not lent (already reclaiming or ended)."""
    from .tasks import reconcile_project_task  # cycle: pools.tasks imports this module

    at = at or timezone.now()
    with transaction.atomic():
        if (
            Loan.objects.filter(pk=loan.pk, state=LoanState.ACTIVE).update(
                state=LoanState.RECLAIMING, reclaim_requested_at=at, reason=reason[:200]
            )
            != 1
        ):
            return False
        reconcile_project_task.delay_on_commit(loan.borrower_id, Allocation.objects.cluster_id_of(loan.allocation_id))
        loan.state, loan.reclaim_requested_at, loan.reason = LoanState.RECLAIMING, at, reason[:200]
        evict_after = at + timedelta(seconds=policy("LENDING_RECLAIM_GRACE_S"))
        loan_reclaimed.send(
            sender=Loan,
            loan=loan,
            loan_id=loan.pk,
            borrower_id=loan.borrower_id,
            lender_pool_id=loan.lender_pool_id,
            allocation_id=loan.allocation_id,
            reason=reason[:200],
            at=at,
            evict_after=evict_after,
        )
    return True


def reclaim_pool(pool, *, reason: str = "the lender asked", at: datetime | None = None) -> int:
    """The lender asks for all its lent units back; returns how many loans started reclaiming."""
    return sum(request_reclaim(loan, reason=reason, at=at) for loan in Loan.objects.granted().filter(lender_pool=pool))


def set_lending(pool, enabled: bool) -> bool:
    """Opt the pool in or out of lending; opting out takes its lent units back (grace period). True if changed."""
    with transaction.atomic():
        changed = type(pool).objects.filter(pk=pool.pk).exclude(lending_enabled=enabled).update(lending_enabled=enabled)
        pool.lending_enabled = enabled
        if changed and not enabled:
            reclaim_pool(pool, reason="the lender opted out of lending")
    return bool(changed)


def _loan_key(loan: Loan) -> tuple[str, str, str]:
    return (loan.borrower.namespace, loan.allocation.gpu.node.name, loan.allocation.resource_name)


def _on_device(returning: list[Loan]) -> tuple[dict[int, list[tuple[str, str]]], dict[tuple[str, str], int | None]]:
    """From the workload mirror (capacity's WorkloadProfile, however attribution learnt the device): per loan, the
    running pods on its lent device that are not its lender's, whatever their project or priority class; and, for
    the pods of the borrowers' namespaces, which device the mirror puts them on ((namespace, pod) -> unit key)."""
    lent_migs = {x.allocation.mig_instance_id for x in returning if x.allocation.mig_instance_id}
    lent_gpus = {x.allocation.gpu_id for x in returning if not x.allocation.mig_instance_id}
    rows = (
        WorkloadProfile.objects.running()
        .filter(
            Q(mig_instance_id__in=lent_migs)
            | Q(gpu_id__in=lent_gpus, mig_instance__isnull=True)
            | Q(namespace__in={x.borrower.namespace for x in returning})
        )
        .order_by("namespace", "pod_name")
        .values_list("namespace", "pod_name", "gpu_id", "mig_instance_id", "project_id")
    )
    on_device: dict[int, list[tuple[str, str]]] = defaultdict(list)
    placed: dict[tuple[str, str], int | None] = {}
    for namespace, name, gpu_id, mig_id, project_id in rows:
        if gpu_id is not None:
            placed[(namespace, name)] = mig_id or -gpu_id
        for loan in returning:
            a = loan.allocation
            here = mig_id == a.mig_instance_id if a.mig_instance_id else (gpu_id == a.gpu_id and mig_id is None)
            if here and project_id != loan.lender_pool.project_id:
                on_device[loan.pk].append((namespace, name))
    return on_device, placed


def _pods_to_evict(kube: KubernetesClient, returning: list[Loan]) -> list[tuple[Loan, str, str]]:
    """(loan, namespace, pod) to take off the units coming back, whatever the pods' priority class:

    - every pod the workload mirror places on a lent device that is not the lender's (exact: DRA claims or the
      kubelet's PodResources);
    - per (borrower namespace, node, resource), from a live list: the borrower's pods there beyond what its other
      open loans and its own units on that node cover, less those already chosen (a pod the device plugin placed
      by count: under the device plugin a borrowed pod gets whichever device of the node is free). Pods of the
      borrowed PriorityClass go first, and a pod the mirror places on one of the borrower's own units is left
      alone: the borrower's own units are not touched.
    """
    if not returning:
        return []
    on_device, placed = _on_device(returning)
    chosen: list[tuple[Loan, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for loan in returning:
        for namespace, name in on_device.get(loan.pk, []):
            if (namespace, name) not in seen:
                seen.add((namespace, name))
                chosen.append((loan, namespace, name))
    returning_ids = {loan.pk for loan in returning}
    keys: dict[tuple[str, str, str], Loan] = {}
    for loan in returning:
        keys.setdefault(_loan_key(loan), loan)
    cluster_id = returning[0].allocation.gpu.node.cluster_id
    kept: dict[tuple[str, str, str], int] = defaultdict(int)
    others = (
        Loan.objects.open()
        .filter(
            borrower__namespace__in={k[0] for k in keys},
            allocation__gpu__node__cluster_id=cluster_id,
            allocation__gpu__node__name__in={k[1] for k in keys},
        )
        .exclude(pk__in=returning_ids)
        .select_related("borrower", "allocation__gpu__node")
    )
    for loan in others:
        kept[_loan_key(loan)] += 1
    own = (
        Allocation.objects.active()
        .filter(
            project__namespace__in={k[0] for k in keys},
            gpu__node__cluster_id=cluster_id,
            gpu__node__name__in={k[1] for k in keys},
        )
        .values_list("project__namespace", "gpu__node__name", "resource_name", "mig_instance_id", "gpu_id")
    )
    own_units: set[tuple[str, int]] = set()
    for namespace, node, resource, mig_id, gpu_id in own:
        kept[(namespace, node, resource)] += 1
        own_units.add((namespace, mig_id or -gpu_id))
    for key in sorted(keys):
        namespace, node, resource = key
        try:
            pods = kube.list_pods_on_node(node, namespace)
        except NotFound:
            continue
        running = []
        for pod in sorted(pods, key=lambda p: (p.priority_class != BORROWED_PRIORITY_CLASS, p.name)):
            uses = pod.requests.get(resource, 0) or (1 if pod.claims else 0)
            if uses and not pod.finished:
                running.append((pod.name, uses))
        excess = sum(uses for _, uses in running) - kept[key]
        excess -= sum(uses for name, uses in running if (namespace, name) in seen)
        for name, uses in running:
            if excess <= 0:
                break
            if (namespace, name) in seen or (namespace, placed.get((namespace, name))) in own_units:
                continue
            seen.add((namespace, name))
            chosen.append((keys[key], namespace, name))
            excess -= uses
    return chosen


def _evict(kube: KubernetesClient, chosen: list[tuple[Loan, str, str]], *, at: datetime) -> list[tuple[Loan, str, str]]:
    """Evict each chosen pod (audited, pools.Eviction): the Eviction API, and a delete when a PodDisruptionBudget
    blocks it, since the grace period was the notice (a lent unit is preemptible). Returns those gone."""
    gone = []
    for loan, namespace, name in chosen:
        reason = f"loan #{loan.pk} of {loan.allocation} ended ({loan.reason or 'the lender needs it'})"
        project = Project.objects.filter(namespace=namespace).values_list("pk", flat=True).first()
        evict(kube, (namespace, name), force=True, reason=reason, loan=loan, project_id=project, at=at)
        gone.append((loan, namespace, name))
    return gone


def _pods_of(loan: Loan, evicted: list[tuple[Loan, str, str]]) -> list[str]:
    """The evicted pods recorded on `loan`: those of its borrower's namespace taken off its unit."""
    return [name for x, namespace, name in evicted if x.pk == loan.pk and namespace == loan.borrower.namespace]


def _pending_units(pod, resource: str) -> int:
    """Units of `resource` a Pending pod waits for: its request, or one per claim under DRA."""
    return int(pod.requests.get(resource) or 0) or len(pod.claims)


def _lender_needs(kube: KubernetesClient, active: list[Loan], reclaiming: list[Loan]) -> set[int]:
    """The lent loans to take back: per (lender pool's namespace, resource), as many as the lender's Pending pods
    wait for there, less the units already coming back (loans reclaiming). Never more: a lender's Pending pod
    takes back one unit, not all its loans."""
    by_need: dict[tuple[str, str], list[Loan]] = defaultdict(list)
    for loan in active:
        by_need[(loan.lender_pool.project.namespace, loan.allocation.resource_name)].append(loan)
    coming: dict[tuple[str, str], int] = defaultdict(int)
    for loan in reclaiming:
        coming[(loan.lender_pool.project.namespace, loan.allocation.resource_name)] += 1
    needed: set[int] = set()
    pending_of: dict[str, list] = {}
    for (namespace, resource), lent in sorted(by_need.items()):
        if namespace not in pending_of:
            try:
                listed = kube.list_pods(namespace, field_selector="status.phase=Pending")
            except NotFound:
                listed = []
            pending_of[namespace] = [p for p in listed if p.pending]
        want = sum(_pending_units(p, resource) for p in pending_of[namespace]) - coming[(namespace, resource)]
        for loan in sorted(lent, key=lambda x: x.pk)[: max(0, want)]:
            needed.add(loan.pk)
    return needed


def reconcile_loans(
    cluster: Cluster, *, now: datetime | None = None, client_factory=KubernetesClient.for_cluster
) -> dict:
    """One pass over the open loans on `cluster` (idempotent; the beat runs it every LENDING_RECONCILE_INTERVAL_S):

    - a loan whose lender's unit or pool was released ends at once (its pods evicted);
    - a lent unit whose lender has a pod Pending for it starts reclaiming;
    - a reclaiming loan past LENDING_RECLAIM_GRACE_S: the borrower's pods on it are evicted, the loan
      ends (returned_at = now) and the borrower's grant is reconciled (quota / template restored).
    """
    now = now or timezone.now()
    grace = timedelta(seconds=policy("LENDING_RECLAIM_GRACE_S"))
    loans = list(
        Loan.objects.open()
        .filter(allocation__gpu__node__cluster=cluster)  # the unit's cluster: a pool may span several
        .select_related("allocation__gpu__node", "lender_pool__project", "borrower")
        .order_by("pk")
    )
    result = {"reclaiming": 0, "ended": 0, "evicted": 0}
    if not loans:
        return result
    with client_factory(cluster) as kube:
        gone = [x for x in loans if x.allocation.released_at is not None or x.lender_pool.released_at is not None]
        active = [x for x in loans if x.state == LoanState.ACTIVE and x not in gone]
        reclaiming = [x for x in loans if x.state == LoanState.RECLAIMING and x not in gone]
        needed = _lender_needs(kube, active, reclaiming)
        borrowers = set()
        for loan in active:
            if loan.pk in needed and request_reclaim(loan, reason="a lender pod is Pending for the unit", at=now):
                loan.state, loan.reclaim_requested_at = LoanState.RECLAIMING, now
                result["reclaiming"] += 1
                borrowers.add(loan.borrower_id)
        due = gone + [
            x
            for x in loans
            if x.state == LoanState.RECLAIMING and x not in gone and x.reclaim_requested_at + grace <= now
        ]
        evicted = _evict(kube, _pods_to_evict(kube, due), at=now)
        result["evicted"] = len(evicted)
    with transaction.atomic():
        for loan in due:
            pods = _pods_of(loan, evicted)
            reason = loan.reason or "the lender's unit was released"
            if (
                Loan.objects.open()
                .filter(pk=loan.pk)
                .update(state=LoanState.ENDED, returned_at=now, reason=reason, evicted_pods=pods)
                == 1
            ):
                result["ended"] += 1
                borrowers.add(loan.borrower_id)
        refresh_on_loan([x.borrower_request_id for x in due if x.borrower_request_id], at=now)
    for borrower_id in sorted(borrowers):
        try:
            reconcile(Project.objects.get(pk=borrower_id), cluster, client_factory=client_factory)
        except KubernetesError:
            logger.warning(
                "reconcile of borrower %s on %s failed; the beat retries", borrower_id, cluster, exc_info=True
            )
    return result


def end_loan(loan: Loan, *, reason: str, at: datetime | None = None) -> bool:
    """The borrower is done with the unit (it gives it back): end now. False when it had ended already."""
    return end_loans([loan.pk], reason=reason, at=at) == 1


def end_loans(loan_ids, *, reason: str, at: datetime | None = None) -> int:
    """End these loans now if still open (returned_at = `at`: billing and the lender's credit stop there),
    reconcile each borrower's grant after commit and refresh its queue entries. Returns how many ended.

    Locks the open loans in primary-key order (as reconcile_loans updates them), then ends them with one
    conditional UPDATE on `open`: a loan a concurrent reclaim ended first is left as it ended. Runs in the
    caller's transaction when there is one. After commit, evict_returned() takes the borrower's low-priority
    pods off the returned units (evict_returned_loans_task): a loan that ends leaves nothing of the borrower
    on the lender's unit, however it ended.
    """
    from .tasks import evict_returned_loans_task, reconcile_project_task  # cycle: pools.tasks imports this module

    at = at or timezone.now()
    with transaction.atomic():
        loans = list(
            Loan.objects.open()
            .filter(pk__in=list(loan_ids))
            .select_for_update(of=("self",))
            .order_by("pk")
            .values_list("pk", "borrower_id", "allocation__gpu__node__cluster_id", "borrower_request_id")
        )
        if not loans:
            return 0
        ended = (
            Loan.objects.open()
            .filter(pk__in=[row[0] for row in loans])
            .update(state=LoanState.ENDED, returned_at=at, reason=reason[:200])
        )
        for borrower_id, cluster_id in sorted({(row[1], row[2]) for row in loans}):
            reconcile_project_task.delay_on_commit(borrower_id, cluster_id)
        evict_returned_loans_task.delay_on_commit([row[0] for row in loans])
        refresh_on_loan([row[3] for row in loans if row[3]], at=at)
    return ended


def evict_returned(loan_ids, *, client_factory=KubernetesClient.for_cluster) -> int:
    """Evict the borrower's low-priority pods from the units of these ended loans, beyond what its open loans
    on the same nodes still cover (_borrower_pods_to_evict); the pods are added to each loan's evicted_pods.
    Idempotent: a pod already gone is skipped, and a second run finds nothing left to evict. Returns how many
    pods were evicted. Raises KubernetesError when a cluster cannot be reached (the task retries)."""
    loans = list(
        Loan.objects.filter(pk__in=list(loan_ids), state=LoanState.ENDED)
        .select_related("allocation__gpu__node__cluster", "borrower", "lender_pool")
        .order_by("pk")
    )
    by_cluster: dict[int, list[Loan]] = defaultdict(list)
    for loan in loans:
        by_cluster[loan.allocation.gpu.node.cluster_id].append(loan)
    evicted_total = 0
    for returned in by_cluster.values():
        with client_factory(returned[0].allocation.gpu.node.cluster) as kube:
            evicted = _evict(kube, _pods_to_evict(kube, returned), at=timezone.now())
        evicted_total += len(evicted)
        for loan in returned:
            pods = _pods_of(loan, evicted)
            if pods:
                Loan.objects.filter(pk=loan.pk).update(evicted_pods=sorted({*loan.evicted_pods, *pods}))
    return evicted_total


def end_request_loans(request: PoolRequest | BestEffortRequest, *, reason: str, at: datetime | None = None) -> int:
    """End every open loan serving `request` (see end_loans). services.transition calls it, in the approval's
    (or rejection's, withdrawal's) own transaction, when a queued request leaves the queue."""
    served = "best_effort" if isinstance(request, BestEffortRequest) else "borrower_request"
    ids = list(Loan.objects.open().filter(**{served: request}).values_list("pk", flat=True))
    # Most requests leave the queue without a loan: one read, no savepoint. end_loans locks and re-checks.
    return end_loans(ids, reason=reason, at=at) if ids else 0


def refresh_on_loan(request_ids, *, at: datetime) -> None:
    """Set or clear QueueEntry.running_on_loan_since for these requests: set (and first_on_loan_at, once)
    when the request is queued and its open loans (lent, or in their grace period) cover its whole count;
    cleared otherwise. Conditional UPDATEs: repeated or concurrent calls leave the first time set."""
    ids = sorted(set(request_ids))
    if not ids:
        return
    held = dict(
        Loan.objects.open()
        .filter(borrower_request__in=ids)
        .values_list("borrower_request")
        .annotate(n=Count("pk"))
        .values_list("borrower_request", "n")
    )
    entries = QueueEntry.objects.filter(request_id__in=ids).values_list(
        "pk", "request_id", "request__state", "request__count"
    )
    for pk, request_id, state, count in entries:
        if state == RequestState.QUEUED and held.get(request_id, 0) >= count:
            QueueEntry.objects.filter(pk=pk, running_on_loan_since__isnull=True).update(
                running_on_loan_since=at, first_on_loan_at=Coalesce("first_on_loan_at", at)
            )
        else:
            QueueEntry.objects.filter(pk=pk, running_on_loan_since__isnull=False).update(running_on_loan_since=None)


def end_best_effort(best_effort: BestEffortRequest, *, reason: str, at: datetime | None = None) -> bool:
    """open -> ended, and its loans end now (the borrower gives the units back; the lenders' credit stops).
    Claimed with a conditional UPDATE: False when it had ended already."""
    at = at or timezone.now()
    with transaction.atomic():
        if (
            BestEffortRequest.objects.filter(pk=best_effort.pk, state=BestEffortState.OPEN).update(
                state=BestEffortState.ENDED, ended_at=at, end_reason=reason[:200]
            )
            != 1
        ):
            return False
        end_request_loans(best_effort, reason=reason, at=at)
    best_effort.state, best_effort.ended_at, best_effort.end_reason = BestEffortState.ENDED, at, reason[:200]
    return True


def end_due_best_effort(*, now: datetime) -> int:
    """End the open best-effort requests whose `until` has come (lend_idle runs it first). Returns how many."""
    due = BestEffortRequest.objects.open().filter(until__lte=now).order_by("pk")
    return sum(end_best_effort(b, reason=f"its end ({b.until:%Y-%m-%d %H:%M} UTC) came", at=now) for b in due)
