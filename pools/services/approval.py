"""Approval: a submitted or queued request takes free units and becomes a pool, in one transaction.

Approval locks units as pools/units/take.py describes; nothing else takes row locks. A unit taken concurrently
trips a unique constraint and approval starts over (APPROVAL_ATTEMPTS).
"""

from __future__ import annotations

import logging
from collections import Counter

from django.db import IntegrityError, transaction
from django.utils import timezone

from capacity.models import Cluster

from .. import services, units
from ..exceptions import DomainError, InsufficientCapacity
from ..models import Allocation, GpuPool, PoolCluster, PoolRequest
from ..units import topology
from .requests import S, _user, transition

logger = logging.getLogger(__name__)

# How many times approval starts over when the unique constraints catch a unit taken concurrently.
APPROVAL_ATTEMPTS = 3


def approve(
    request: PoolRequest,
    *,
    actor,
    reason: str = "",
    cluster: Cluster | None = None,
    policy=None,
    free: units.FreeUnits | None = None,
) -> GpuPool:
    """Approve a submitted (or queued) request: take its units, create the pool and its allocations, start provisioning.

    One transaction: claim submitted -> approved (a conditional UPDATE, which also row-locks the
    request), take units on one cluster, or across clusters when the request allows it and no one
    cluster has them all (_take; pools/units/take.py: SKIP LOCKED row locks on PostgreSQL), create the
    GpuPool, one PoolCluster per cluster and one Allocation per unit, move on to provisioning, and
    enqueue provisioning on commit. Billing starts here: approved_at and every allocated_at are the
    same instant.

    `cluster` (or the request's own cluster) restricts where units may come from. Raises
    IllegalTransition when the request is not submitted, DomainError when it has already ended, and
    InsufficientCapacity (nothing written, nothing enqueued) when the units cannot be had.
    If a unique constraint on Allocation catches a unit taken concurrently, the whole approval
    starts over, up to APPROVAL_ATTEMPTS times. `policy` (an AutoApprovalPolicy) is recorded on the
    request when a rule, not a person, approved it (scheduling/queue.py). `free`: the units.read_free() of
    this request that the caller made in the same transaction (the queue's fit test), so that the first
    attempt does not read them again; the units are locked and checked as always.
    """
    if request.end_at is not None and request.end_at <= timezone.now():
        raise DomainError(f"Pool request #{request.pk} ended at {request.end_at:%Y-%m-%d %H:%M}; it cannot start now.")
    if cluster is not None:
        request.cluster = cluster
    for attempt in range(1, APPROVAL_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                return _approve_once(request, actor=actor, reason=reason, policy=policy, free=free)
        except IntegrityError:
            _reload_state(request)
            free = None  # others took units: read them again
            logger.info(
                "approval of request %s collided on a unit (attempt %d of %d)", request.pk, attempt, APPROVAL_ATTEMPTS
            )
        except DomainError:
            _reload_state(request)  # the transaction rolled back: so must the object
            raise
    raise DomainError("Units were taken by concurrent approvals; try again.")


def _reload_state(request: PoolRequest) -> None:
    request.refresh_from_db(
        fields=["state", "state_reason", "approved_at", "approved_by", "approved_by_policy", "updated_at"]
    )


def _approve_once(request: PoolRequest, *, actor, reason: str, policy=None, free=None) -> GpuPool:
    now = timezone.now()
    transition(
        request,
        S.APPROVED,
        actor,
        reason or "approved",
        approved_at=now,
        approved_by=_user(actor),
        approved_by_policy=policy,
    )
    taken = _take(request, free)
    if not taken:
        message, detail = units.shortage(request, units.free_by_cluster(request))
        raise InsufficientCapacity(message, detail=detail)
    per_cluster = Counter(u.cluster_id for u in taken)  # in the order taken: the home cluster first
    pool = GpuPool.objects.create(
        project_id=request.project_id,
        request=request,
        cluster_id=taken[0].cluster_id,
        name=request.name or f"pool-{request.pk}",
        workload_type=request.workload_type,
        tier=request.tier,
        tags=[request.spec_label, *[t for t in request.tags if t != request.spec_label]],
        placement=topology.placement(request, [u.node_name for u in taken], units.localities(request, taken)),
        created_at=now,
    )
    Allocation.objects.bulk_create(
        Allocation(
            pool=pool,
            project_id=request.project_id,
            kind=request.spec_kind,
            gpu_id=u.gpu_id,
            mig_instance_id=u.mig_instance_id,
            replica=u.replica,
            resource_name=u.resource_name,
            product=u.product,
            profile_name=u.profile_name,
            compute_slices=u.compute_slices,
            allocated_at=now,
        )
        for u in taken
    )
    PoolCluster.objects.bulk_create(PoolCluster(pool=pool, cluster_id=c, units=n) for c, n in per_cluster.items())
    names = dict(Cluster.objects.filter(pk__in=per_cluster).values_list("pk", "name"))
    where = ", ".join(f"{names[c]} ({n})" if len(per_cluster) > 1 else names[c] for c, n in per_cluster.items())
    transition(request, S.PROVISIONING, actor, f"{len(taken)} units on {where}; provisioning")
    services.enqueue_provisioning(pool)
    return pool


def _take(request: PoolRequest, read: units.FreeUnits | None = None) -> list[units.Unit]:
    """All the request's units, or [] when they cannot be had: on one cluster (best fit) if one has them
    all; otherwise, when the request may span clusters (units.may_span), across clusters of one binding,
    the largest free first. Locks as pools/units/take.py describes, within the caller's transaction."""
    need = request.count
    read = read or units.read_free_to_take(request)
    if units.may_span(request):
        units.lock_clusters(read.by_cluster)  # spanning approvals take turns: read the free units again after it
        read = units.read_free_to_take(request)
    free = read.by_cluster
    for cluster_id in units.choose_clusters(free, need):
        taken = units.take_units(request, cluster_id, need, read)
        if len(taken) == need:
            return taken
        free[cluster_id] = len(taken)  # others hold the rest now
    if not units.may_span(request):
        return []
    taken = []
    for cluster_id in units.spread_clusters(free, need):
        taken += units.take_units(request, cluster_id, need - len(taken), read)
        if len(taken) == need:
            return taken
    return []  # others took units meanwhile: the transaction rolls back what was locked
