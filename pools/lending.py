"""Lending a pool's idle units to other projects, and taking them back (docs/queue.md, Borrowing).

The lender keeps its allocation throughout: a loan only adds the unit to the borrower's grant
(device plugin: its quota and the node's project label; DRA: a claim template admitting the lent
UUID), for pods of the low PriorityClass `gpuaas-borrowed`. When the lender needs the unit (a pod of
its namespace Pending for the unit's resource, or the lender asks), the loan goes to `reclaiming`:
the borrower's grant shrinks at once (no new pods), and after LENDING_RECLAIM_GRACE_S its pods on
the unit's node are evicted through the Eviction API and the loan ends. `reconcile_loans()` drives
this from the beat; every step is a conditional UPDATE, so repeated or concurrent runs are harmless.
Which units to lend (idle data) is decided by monitoring (monitoring/services/lending.py).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from capacity.adapters.kubernetes import KubernetesClient, KubernetesError, NotFound
from capacity.models import Cluster
from tenancy.models import Project

from .choices import LoanState
from .exceptions import LendingRefused
from .models import Allocation, Loan, PoolRequest
from .provisioning import BORROWED_PRIORITY_CLASS, reconcile

logger = logging.getLogger(__name__)


def lend(
    allocation: Allocation, borrower: Project, *, request: PoolRequest | None = None, at: datetime | None = None
) -> Loan:
    """Lend one active unit to `borrower`; the borrower's grant is reconciled after commit.

    Refused (LendingRefused) when the pool opted out, the unit is released or already lent, or the
    borrower is the lender. The partial unique constraint makes a double loan impossible: a concurrent
    lend of the same unit is refused too.
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
            loan = Loan.objects.create(
                allocation=allocation,
                lender_pool=pool,
                borrower=borrower,
                borrower_request=request,
                started_at=at or timezone.now(),
            )
            reconcile_project_task.delay_on_commit(borrower.pk, Allocation.objects.cluster_id_of(allocation.pk))
    except IntegrityError:  # pools_loan_unique_open_allocation
        raise LendingRefused(f"{allocation} is already lent") from None
    return loan


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


def _borrower_pods_to_evict(kube: KubernetesClient, loans: list[Loan]) -> list[tuple[str, str]]:
    """Per (borrower namespace, node, resource): as many of the borrower's low-priority pods there as units
    come back (pods of the borrowed PriorityClass only; the borrower's own units are never touched)."""
    wanted: dict[tuple[str, str, str], int] = defaultdict(int)
    for loan in loans:
        wanted[(loan.borrower.namespace, loan.allocation.gpu.node.name, loan.allocation.resource_name)] += 1
    chosen: list[tuple[str, str]] = []
    for (namespace, node, resource), count in sorted(wanted.items()):
        try:
            pods = kube.list_pods_on_node(node, namespace)
        except NotFound:
            continue
        freed = 0
        for pod in sorted(pods, key=lambda p: p.name):
            if freed >= count:
                break
            if pod.finished or pod.priority_class != BORROWED_PRIORITY_CLASS:
                continue
            uses = pod.requests.get(resource, 0) or (1 if pod.claims else 0)
            if uses:
                chosen.append((namespace, pod.name))
                freed += uses
    return chosen


def _lender_needs(kube: KubernetesClient, loans: list[Loan]) -> set[int]:
    """Loans whose lender has a pod Pending for the lent resource (device plugin) or any claim (DRA)."""
    by_lender: dict[str, list[Loan]] = defaultdict(list)
    for loan in loans:
        by_lender[loan.lender_pool.project.namespace].append(loan)
    needed: set[int] = set()
    for namespace, lent in sorted(by_lender.items()):
        try:
            pending = [p for p in kube.list_pods(namespace, field_selector="status.phase=Pending") if p.pending]
        except NotFound:
            continue
        for loan in lent:
            if any(p.requests.get(loan.allocation.resource_name) or p.claims for p in pending):
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
    grace = timedelta(seconds=settings.LENDING_RECLAIM_GRACE_S)
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
        needed = _lender_needs(kube, active)
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
        evicted = _borrower_pods_to_evict(kube, due) if due else []
        for namespace, name in evicted:
            try:
                kube.evict_pod(namespace, name)
            except NotFound:
                pass
        result["evicted"] = len(evicted)
    with transaction.atomic():
        for loan in due:
            pods = [name for namespace, name in evicted if namespace == loan.borrower.namespace]
            reason = loan.reason or "the lender's unit was released"
            if (
                Loan.objects.open()
                .filter(pk=loan.pk)
                .update(state=LoanState.ENDED, returned_at=now, reason=reason, evicted_pods=pods)
                == 1
            ):
                result["ended"] += 1
                borrowers.add(loan.borrower_id)
    for borrower_id in sorted(borrowers):
        try:
            reconcile(Project.objects.get(pk=borrower_id), cluster, client_factory=client_factory)
        except KubernetesError:
            logger.warning(
                "reconcile of borrower %s on %s failed; the beat retries", borrower_id, cluster, exc_info=True
            )
    return result


def end_loan(loan: Loan, *, reason: str, at: datetime | None = None) -> bool:
    """The borrower is done with the unit (its request approved elsewhere, or it gives it back): end now."""
    from .tasks import reconcile_project_task  # cycle: pools.tasks imports this module

    at = at or timezone.now()
    with transaction.atomic():
        if (
            Loan.objects.open().filter(pk=loan.pk).update(state=LoanState.ENDED, returned_at=at, reason=reason[:200])
            != 1
        ):
            return False
        reconcile_project_task.delay_on_commit(loan.borrower_id, Allocation.objects.cluster_id_of(loan.allocation_id))
    return True
