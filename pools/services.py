"""The pool-request workflow: draft -> submitted -> approved -> provisioning -> active -> released.

Every state change goes through `transition()`: one table of legal moves, a conditional UPDATE that
must touch exactly one row (`filter(pk=..., state=OLD).update(state=NEW) == 1`), and one
PoolRequestTransition row saying who, when and why. An illegal move raises IllegalTransition (409).

Writes are atomic. Approval locks units as pools/units.py describes; nothing else takes row locks.
Kubernetes work (provisioning, clean-up after release) is enqueued after commit and lives in
pools/provisioning.py.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
from collections import Counter

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from capacity.choices import Binding
from capacity.models import Cluster, GpuCapacity, MigInstance, MigReconfiguration, NodeCapacity
from core.leases import lease_until
from tenancy.models import Project

from . import ending, signals, specs, topology, units
from .choices import PoolState, RequestState
from .exceptions import DomainError, IllegalTransition, InsufficientCapacity
from .models import Allocation, GpuPool, PoolCluster, PoolRequest, PoolRequestTransition

logger = logging.getLogger(__name__)

S = RequestState
TRANSITIONS: dict[str, frozenset[str]] = {
    S.DRAFT: frozenset({S.SUBMITTED, S.WITHDRAWN}),
    S.SUBMITTED: frozenset({S.APPROVED, S.REJECTED, S.WITHDRAWN, S.QUEUED}),
    S.QUEUED: frozenset({S.APPROVED, S.REJECTED, S.WITHDRAWN}),  # scheduling/queue.py
    S.APPROVED: frozenset({S.PROVISIONING}),
    S.PROVISIONING: frozenset({S.ACTIVE, S.FAILED, S.RELEASED, S.EXPIRED}),
    S.ACTIVE: frozenset({S.RELEASED, S.EXPIRED}),
    S.FAILED: frozenset({S.PROVISIONING, S.RELEASED, S.EXPIRED}),
    S.REJECTED: frozenset(),
    S.WITHDRAWN: frozenset(),
    S.RELEASED: frozenset(),
    S.EXPIRED: frozenset(),
}
# A queued request that leaves the queue ends the loans it ran on (pools/lending.py), saying why.
LOANS_END_ON_LEAVING_QUEUE: dict[str, str] = {
    S.APPROVED: "its own units were approved",
    S.REJECTED: "its request left the queue (rejected)",
    S.WITHDRAWN: "its request was withdrawn",
}
# How many times approval starts over when the unique constraints catch a unit taken concurrently.
APPROVAL_ATTEMPTS = 3


def is_legal(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def transition(request: PoolRequest, to_state: str, actor=None, reason: str = "", **fields) -> PoolRequest:
    """Move `request` to `to_state`, recording who and why; extra `fields` are set in the same UPDATE.

    Claims the move with a conditional UPDATE on the state it read, so two concurrent moves of one
    request cannot both succeed. If the claim misses because the object was stale, the state is read
    again and the move is tried from there when the table allows it (a release still releases a
    request that became active meanwhile); otherwise IllegalTransition names the state it lost to.
    A queued request leaving the queue ends the loans it ran on, in the same transaction
    (LOANS_END_ON_LEAVING_QUEUE, pools.lending.end_request_loans; the borrower's grant is reconciled
    after commit). Updates `request` in place and returns it.
    """
    now = timezone.now()
    actor = _user(actor)
    from_state = request.state
    with transaction.atomic():
        for _ in range(len(TRANSITIONS)):  # each miss means the state moved on: bounded by the states
            if not is_legal(from_state, to_state):
                raise IllegalTransition(request.pk, from_state, to_state)
            claimed = PoolRequest.objects.filter(pk=request.pk, state=from_state).update(
                state=to_state, state_reason=reason, updated_at=now, **fields
            )
            if claimed == 1:
                break
            from_state = PoolRequest.objects.filter(pk=request.pk).values_list("state", flat=True).first() or "gone"
        else:
            raise IllegalTransition(request.pk, from_state, to_state)
        PoolRequestTransition.objects.create(
            request=request, from_state=from_state, to_state=to_state, actor=actor, reason=reason, at=now
        )
        _announce(request, from_state, to_state, actor=actor, reason=reason, at=now)
        if from_state == S.QUEUED and to_state in LOANS_END_ON_LEAVING_QUEUE:
            from . import lending  # cycle: lending imports provisioning, which imports this module

            # At the approval's own instant, when it sets one: billing of its own units starts there.
            at = fields.get("approved_at") or now
            lending.end_request_loans(request, reason=LOANS_END_ON_LEAVING_QUEUE[to_state], at=at)
    request.state, request.state_reason, request.updated_at = to_state, reason, now
    for name, value in fields.items():
        setattr(request, name, value)
    return request


def _announce(request: PoolRequest, from_state: str, to_state: str, *, actor, reason: str, at: dt.datetime) -> None:
    """Send the pools.signals signal of this move, if it is one people are told about (in the caller's transaction)."""
    if to_state == S.APPROVED:
        signal = signals.request_started_from_queue if from_state == S.QUEUED else signals.request_approved
    elif to_state == S.QUEUED:
        signal = signals.request_queued
    elif to_state == S.REJECTED:
        signal = signals.request_refused
    else:
        return
    signal.send(sender=PoolRequest, request=request, actor=actor, reason=reason, at=at)


# --- Creating and submitting ---------------------------------------------------------------------


def inventory_products() -> set[str]:
    """Every product name present in the fleet: catalog keys, NVML names and GFD names."""
    present = GpuCapacity.objects.present()
    names = set(present.exclude(catalog_product="").values_list("catalog_product", flat=True).distinct())
    names |= set(present.values_list("product", flat=True).distinct())
    names |= set(NodeCapacity.objects.present().exclude(gpu_product="").values_list("gpu_product", flat=True))
    return names


def fleet_mig_products() -> list[str]:
    rows = GpuCapacity.objects.present().filter(mig_mode_current=True).exclude(catalog_product="")
    return sorted(set(rows.values_list("catalog_product", flat=True).distinct()))


def resolve_spec(**declared) -> specs.Spec:
    """specs.resolve with the fleet's products filled in (two small queries)."""
    return specs.resolve(inventory_products=inventory_products(), fleet_mig_products=fleet_mig_products(), **declared)


def create_request(project: Project, *, actor, submit: bool = False, **values) -> PoolRequest:
    """Create a draft request (and submit it at once when `submit`), recording the creation.

    `values` are PoolRequest fields already resolved to a spec (see resolve_spec).
    """
    with transaction.atomic():
        request = PoolRequest.objects.create(project=project, requested_by=_user(actor), **values)
        if submit:
            transition(request, S.SUBMITTED, actor, "submitted")
    return request


def submit(request: PoolRequest, *, actor, reason: str = "") -> PoolRequest:
    """draft -> submitted; refused (DomainError, nothing changed) when no unit of the fleet would ever serve
    the request under the tier profile policy (units.refusal: the rule and the nearest offer that would)."""
    never = units.refusal(request)
    if never:
        raise DomainError(f"It can never be served: {never}.", detail={"profile_name": never})
    return transition(request, S.SUBMITTED, actor, reason or "submitted")


def withdraw(request: PoolRequest, *, actor, reason: str = "") -> PoolRequest:
    return transition(request, S.WITHDRAWN, actor, reason or "withdrawn")


def reject(request: PoolRequest, *, actor, reason: str) -> PoolRequest:
    if not reason.strip():
        raise DomainError("Give a reason for the rejection.", detail={"reason": "required"})
    return transition(request, S.REJECTED, actor, reason)


# --- Approval ------------------------------------------------------------------------------------


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
    cluster has them all (_take; pools/units.py: SKIP LOCKED row locks on PostgreSQL), create the
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
            if attempt == APPROVAL_ATTEMPTS:
                raise DomainError("Units were taken by concurrent approvals; try again.") from None
            logger.info("approval of request %s collided on a unit; attempt %d", request.pk, attempt + 1)
        except DomainError:
            _reload_state(request)  # the transaction rolled back: so must the object
            raise
    raise AssertionError("unreachable")


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
    enqueue_provisioning(pool)
    return pool


def _take(request: PoolRequest, read: units.FreeUnits | None = None) -> list[units.Unit]:
    """All the request's units, or [] when they cannot be had: on one cluster (best fit) if one has them
    all; otherwise, when the request may span clusters (units.may_span), across clusters of one binding,
    the largest free first. Locks as pools/units.py describes, within the caller's transaction."""
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


def _user(actor):
    return actor if actor is not None and getattr(actor, "is_authenticated", False) else None


def set_share_priority(pool: GpuPool, priority: str, *, actor=None) -> bool:
    """Set a time-sliced or MPS pool's share priority (operators) and reconcile its project on each of its clusters
    after commit, so the pool's ConfigMap names the new PriorityClass. True if it changed; idempotent.

    Raises ValueError for a pool whose units are not replicas of shared GPUs (no priority to give).
    """
    if not pool.is_shared:
        raise ValueError("Only time-sliced and MPS pools have a share priority.")
    from .tasks import reconcile_project_task  # cycle: pools.tasks imports this module

    with transaction.atomic():
        changed = GpuPool.objects.filter(pk=pool.pk).exclude(share_priority=priority).update(share_priority=priority)
        pool.share_priority = priority
        if changed:
            for cluster_id in sorted(PoolCluster.objects.filter(pool=pool).values_list("cluster_id", flat=True)) or [
                pool.cluster_id
            ]:
                reconcile_project_task.delay_on_commit(pool.project_id, cluster_id)
    logger.info("pool %s share priority -> %s by %s (changed: %s)", pool.pk, priority, _user(actor), bool(changed))
    return bool(changed)


def enqueue_provisioning(pool: GpuPool) -> None:
    """Enqueue provisioning on commit, with a lease: if no worker claims the pool before the lease
    runs out (message lost, worker dead), sweep_provisioning() enqueues it again."""
    from .tasks import provision_pool_task  # cycle: pools.tasks imports this module

    GpuPool.objects.filter(pk=pool.pk, state=PoolState.PROVISIONING).update(
        claimed_by="", lease_expires_at=lease_until()
    )
    provision_pool_task.delay_on_commit(pool.pk)


def enqueue_queue_processing() -> None:
    """Units came free: offer them to the queue's head after commit (pools.signals.queue_pass_wanted, which
    scheduling answers with scheduling.queue.process())."""
    signals.queue_pass_wanted.send(sender=PoolRequest)


def enqueue_deprovisioning(pool: GpuPool) -> None:
    from .tasks import deprovision_pool_task  # cycle: pools.tasks imports this module

    deprovision_pool_task.delay_on_commit(pool.pk)


# --- Provisioning outcome, retry, release ----------------------------------------------------------


def mark_provisioned(pool: GpuPool) -> bool:
    """provisioning -> active for the pool and its request; False when the pool moved on meanwhile."""
    with transaction.atomic():
        now = timezone.now()
        if (
            GpuPool.objects.filter(pk=pool.pk, state=PoolState.PROVISIONING).update(
                state=PoolState.ACTIVE, state_reason="", provisioned_at=now, claimed_by="", lease_expires_at=None
            )
            != 1
        ):
            return False
        request = PoolRequest.objects.get(pk=pool.request_id)
        transition(request, S.ACTIVE, None, "provisioned in Kubernetes")
    pool.state, pool.state_reason, pool.provisioned_at = PoolState.ACTIVE, "", now
    return True


def mark_failed(pool: GpuPool, reason: str) -> bool:
    """provisioning -> failed for the pool and its request, with the reason; False if it moved on."""
    reason = reason[:2000]
    with transaction.atomic():
        if (
            GpuPool.objects.filter(pk=pool.pk, state=PoolState.PROVISIONING).update(
                state=PoolState.FAILED, state_reason=reason, claimed_by="", lease_expires_at=None
            )
            != 1
        ):
            return False
        request = PoolRequest.objects.get(pk=pool.request_id)
        transition(request, S.FAILED, None, reason)
    pool.state, pool.state_reason = PoolState.FAILED, reason
    return True


def retry_provisioning(pool: GpuPool, *, actor, reason: str = "") -> GpuPool:
    """failed -> provisioning again (pool and request) and enqueue provisioning on commit.

    A pool still in provisioning (its task lost, say) is simply enqueued again: provisioning is
    idempotent. Any other state raises IllegalTransition.
    """
    with transaction.atomic():
        request = PoolRequest.objects.get(pk=pool.request_id)
        if pool.state == PoolState.PROVISIONING and request.state == S.PROVISIONING:
            enqueue_provisioning(pool)
            return pool
        transition(request, S.PROVISIONING, actor, reason or "retry provisioning")
        if (
            GpuPool.objects.filter(pk=pool.pk, state=PoolState.FAILED).update(
                state=PoolState.PROVISIONING, state_reason=""
            )
            != 1
        ):
            raise IllegalTransition(request.pk, pool.state, S.PROVISIONING)
        pool.state, pool.state_reason = PoolState.PROVISIONING, ""
        enqueue_provisioning(pool)
    return pool


def release(request: PoolRequest, *, actor, reason: str = "", to_state: str = S.RELEASED) -> PoolRequest:
    """Release (or expire) a request: its units are freed now, Kubernetes is cleaned up after commit.

    One transaction: claim the request's move, mark its pool released and set released_at on every
    active allocation (billing stops here), then enqueue the clean-up (quota removed or reduced,
    node labels removed) on commit. Idempotent through the claim: a second call raises IllegalTransition.
    """
    with transaction.atomic():
        now = timezone.now()
        transition(request, to_state, actor, reason or to_state)
        pool = GpuPool.objects.filter(request=request).first()
        if pool is not None:
            GpuPool.objects.filter(pk=pool.pk).update(state=PoolState.RELEASED, released_at=now, state_reason=reason)
            ended = list(Allocation.objects.active().filter(pool=pool).values_list("pk", flat=True))
            Allocation.objects.filter(pk__in=ended, released_at__isnull=True).update(released_at=now)
            # The units are "ending" until their pods are gone (pools/ending.py); the project is told now.
            ending.announce_ending(ended, reason=reason or f"the request was {to_state}", at=now)
            enqueue_deprovisioning(pool)
            enqueue_queue_processing()
    return request


def release_unit(allocation: Allocation, *, actor=None, reason: str = "", at: dt.datetime | None = None) -> None:
    """Release one allocated unit on behalf of another app (monitoring's idle reservations).

    The pool's last active unit releases the whole request (release(): quota and labels cleaned up
    after commit); otherwise only this unit is released (release_allocation). A unit released
    already is left alone. Runs in the caller's transaction when there is one.
    """
    if allocation.released_at is not None:
        return
    others = Allocation.objects.active().filter(pool_id=allocation.pool_id).exclude(pk=allocation.pk)
    if others.exists():
        release_allocation(allocation.pk, at=at, reason=reason)
    else:
        release(allocation.pool.request, actor=actor, reason=reason)


def release_allocation(allocation_id: int, *, at: dt.datetime | None = None, reason: str = "") -> bool:
    """Release ONE unit of a pool that keeps others: set released_at, then reconcile the project's
    Kubernetes quota and labels after commit (pools.provisioning.reconcile, idempotent).

    release() frees whole requests; this frees a single unit (idle reservations).
    Claimed with a conditional UPDATE (released_at still null): a repeat does nothing.
    """
    at = at or timezone.now()
    with transaction.atomic():
        if Allocation.objects.filter(pk=allocation_id, released_at__isnull=True).update(released_at=at) != 1:
            return False
        ending.announce_ending([allocation_id], reason=reason or "the unit was released", at=at)
        _reconcile_after_commit(Allocation.objects.get(pk=allocation_id))
        enqueue_queue_processing()
    return True


# --- Expiry --------------------------------------------------------------------------------------


def expire_due(*, now: dt.datetime | None = None, notice_s: int | None = None, limit: int = 500) -> dict[str, int]:
    """Give notice to, then expire, requests whose end has come. Idempotent; safe to run concurrently.

    A holding request whose end is within `notice_s` (settings.POOL_EXPIRY_NOTICE_S) gets a notice:
    expiry_notice_at is claimed with a conditional UPDATE and an audit row (state unchanged, reason
    "expiry notice") is written. It expires once its end has passed AND the notice is at least
    `notice_s` old, so a project always gets the full notice, even after an outage of the beat.
    """
    now = now or timezone.now()
    notice_s = settings.POOL_EXPIRY_NOTICE_S if notice_s is None else notice_s
    notice = dt.timedelta(seconds=notice_s)
    noticed = expired = 0
    due = PoolRequest.objects.holding().filter(end_at__isnull=False, expiry_notice_at__isnull=True)
    for request in due.filter(end_at__lte=now + notice).order_by("end_at", "pk")[:limit]:
        with transaction.atomic():
            if PoolRequest.objects.filter(pk=request.pk, expiry_notice_at__isnull=True).update(expiry_notice_at=now):
                PoolRequestTransition.objects.create(
                    request=request,
                    from_state=request.state,
                    to_state=request.state,
                    reason=f"expiry notice: ends {request.end_at:%Y-%m-%d %H:%M} UTC; "
                    f"released at {max(request.end_at, now + notice):%Y-%m-%d %H:%M} UTC at the earliest",
                    at=now,
                )
                noticed += 1
    ripe = PoolRequest.objects.holding().filter(end_at__lte=now, expiry_notice_at__lte=now - notice)
    for request in ripe.order_by("end_at", "pk")[:limit]:
        try:
            release(
                request, actor=None, reason=f"expired: ended {request.end_at:%Y-%m-%d %H:%M} UTC", to_state=S.EXPIRED
            )
            expired += 1
        except IllegalTransition:
            continue  # released, or expired by a concurrent run
    return {"noticed": noticed, "expired": expired}


def pools_awaiting_cleanup(*, older_than_s: int = 300):
    """Released pools whose Kubernetes clean-up has not succeeded yet (for the periodic sweep)."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_s)
    return GpuPool.objects.filter(released_at__lte=cutoff, deprovisioned_at__isnull=True)


def rehome_allocations(instance_ids: list[int], *, at: dt.datetime, cause: str | None = None) -> list[str]:
    """Active MIG allocations on destroyed instances (`instance_ids`) move or end, now, in the caller's transaction.

    Each moves to a free active instance of the same profile on the same GPU (the one at the same
    start first: the unit is equivalent, the device plugin advertises it under the same resource).
    Without one it ends: released_at = `at` (billing stops at that second), end_reason says why
    (the project's statement shows it) and the pool keeps its other units, short of its request
    (GpuPool.shortfall). Never leaves an active allocation on a destroyed instance. Locks the
    allocations in primary-key order (select_for_update). Returns one note per allocation.
    Each allocation that ends is announced (pools.signals.allocation_ended) with `cause`, or, when None,
    MIG_CHANGE if a reconfiguration of its node is open and MAINTENANCE otherwise.
    """
    notes: list[str] = []
    with transaction.atomic():
        orphans = list(
            Allocation.objects.active()
            .filter(mig_instance_id__in=instance_ids)
            .exclude(mig_instance__state="active")
            .select_related("mig_instance__profile", "gpu", "pool")
            .select_for_update(of=("self",))
            .order_by("pk")
        )
        for allocation in orphans:
            old = allocation.mig_instance
            held = Allocation.objects.active().filter(mig_instance__isnull=False).values("mig_instance")
            candidates = list(
                MigInstance.objects.active()
                .filter(gpu_id=allocation.gpu_id, profile_id=old.profile_id)
                .exclude(pk__in=held)
                .order_by("placement_start", "pk")
            )
            same_start = [m for m in candidates if m.placement_start == old.placement_start]
            replacement = (same_start or candidates or [None])[0]
            where = f"{old.profile.name} at {old.placement_start} on GPU {allocation.gpu.uuid}"
            if replacement is not None and move_mig_allocation(allocation, from_instance=old, to_instance=replacement):
                notes.append(
                    f"allocation #{allocation.pk} moved from the destroyed {where} to the {old.profile.name} "
                    f"at {replacement.placement_start}"
                )
                continue
            reason = f"MIG instance {where} destroyed at {at:%Y-%m-%d %H:%M:%S} UTC; no equivalent instance left"
            if Allocation.objects.filter(pk=allocation.pk, released_at__isnull=True).update(
                released_at=at, end_reason=reason
            ):
                _reconcile_after_commit(allocation)
                ending.announce_ending([allocation.pk], reason=reason, at=at)
                allocation.released_at, allocation.end_reason = at, reason
                signals.allocation_ended.send(
                    sender=Allocation,
                    allocation=allocation,
                    cause=cause or _end_cause(allocation),
                    reason=reason,
                    at=at,
                )
            notes.append(f"allocation #{allocation.pk} ended: {reason}")
    for note in notes:
        logger.warning("%s", note)
    return notes


def _end_cause(allocation: Allocation) -> str:
    """MIG_CHANGE while a reconfiguration holds the allocation's node, MAINTENANCE otherwise."""
    changing = MigReconfiguration.objects.open().filter(node_id=allocation.gpu.node_id).exists()
    return signals.AllocationEndCause.MIG_CHANGE if changing else signals.AllocationEndCause.MAINTENANCE


def _reconcile_after_commit(allocation: Allocation) -> None:
    """Reconcile the project on the allocation's own cluster (a pool may span several) after commit."""
    from .tasks import reconcile_project_task  # cycle: pools.tasks imports this module

    reconcile_project_task.delay_on_commit(allocation.project_id, Allocation.objects.cluster_id_of(allocation.pk))


def move_mig_allocation(allocation: Allocation, *, from_instance, to_instance) -> bool:
    """Point a MIG allocation at an equivalent instance (same GPU, profile and start) that replaced its
    own, as a MIG reconfiguration does when it recreates instances. A conditional UPDATE: False when
    the allocation no longer holds `from_instance` (someone moved it first). The partial unique
    constraint on active allocations refuses a second holder of `to_instance` (IntegrityError).

    On a DRA cluster the pool's ResourceClaimTemplate names the instance's UUID: the project is reconciled
    after commit so the template admits the new instance (pools.provisioning)."""
    moved = Allocation.objects.filter(pk=allocation.pk, mig_instance=from_instance).update(mig_instance=to_instance)
    if moved == 1 and Cluster.objects.filter(nodes__gpus=allocation.gpu_id, binding=Binding.DRA).exists():
        _reconcile_after_commit(allocation)
    return moved == 1


def move_allocation(allocation_id: int, *, away_from) -> units.Unit | None:
    """Move an active reservation off the nodes `away_from` (ids) onto an equivalent free unit, now.

    One transaction: lock the allocation (select_for_update), take one unit the way approval does
    (units.take_units: free by the one definition, same kind, product, profile, tier and cluster, hence
    binding; SKIP LOCKED row locks; the project's own other nodes first, `away_from` never), point the
    allocation at it with a conditional UPDATE (billing goes on: the reservation never lapses) and
    reconcile the project after commit, which rewrites its quota and DRA templates (pools.provisioning).
    Returns the unit taken, or None with nothing changed: no free equivalent unit, or the allocation is no
    longer active on those nodes (moved already: safe to repeat). Used by drain-and-move (operations/maintenance).
    """
    away = frozenset(away_from)
    with transaction.atomic():
        allocation = (
            Allocation.objects.active()
            .filter(pk=allocation_id, gpu__node_id__in=away)
            .select_related("pool__request", "gpu__node")
            .select_for_update(of=("self",))
            .first()
        )
        if allocation is None:
            return None
        cluster_id = allocation.gpu.node.cluster_id
        like = copy.copy(allocation.pool.request)  # the request's tier and workload, this unit's own kind
        like.spec_kind, like.product, like.profile_name = allocation.kind, allocation.product, allocation.profile_name
        like.cluster_id, like.count = cluster_id, 1
        taken = units.take_units(like, cluster_id, 1, away_from=away)
        if not taken:
            return None
        unit = taken[0]
        try:
            with transaction.atomic():
                moved = Allocation.objects.filter(pk=allocation.pk, released_at__isnull=True).update(
                    gpu_id=unit.gpu_id,
                    mig_instance_id=unit.mig_instance_id,
                    replica=unit.replica,
                    resource_name=unit.resource_name,
                )
        except IntegrityError:  # taken meanwhile by a writer that does not lock (the constraint caught it)
            return None
        if moved != 1:
            return None
        _reconcile_after_commit(allocation)
    return unit


def claim_provisioning(pool: GpuPool, *, token: str, task_id: str = "") -> bool:
    """Claim a provisioning pool for the run `token` and record the attempt; False when another live
    run holds it or it is no longer provisioning (nothing to do).

    One conditional UPDATE: the pool must be provisioning and unclaimed, already ours (a redelivered
    task), or held by a run whose lease ran out (its worker died). The claim holds a lease of
    WORKFLOW_LEASE_S that the running worker renews (core.leases.Heartbeat).
    """
    now = timezone.now()
    free = Q(claimed_by="") | Q(claimed_by=token) | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    return (
        GpuPool.objects.filter(free, pk=pool.pk, state=PoolState.PROVISIONING).update(
            claimed_by=token[:64],
            lease_expires_at=lease_until(now),
            attempts=F("attempts") + 1,
            last_attempt_at=now,
            task_id=task_id[:64],
        )
        == 1
    )


def sweep_provisioning(*, now: dt.datetime | None = None, limit: int = 500) -> list[int]:
    """Re-enqueue provisioning whose lease ran out: its worker died mid-run or its message was lost.

    Beat, every WORKFLOW_SWEEP_S. Each re-send is claimed with a conditional UPDATE on the lease
    it read (a new lease, claim cleared), so two concurrent sweeps never both re-send a pool, and
    written to the request's audit trail. Never relies on the broker's redelivery. Returns the pool ids.
    """
    now = now or timezone.now()
    swept = []
    expired = GpuPool.objects.filter(state=PoolState.PROVISIONING).filter(
        Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
    )
    for pk, request_id, claimed_by, lease in expired.order_by("pk").values_list(
        "pk", "request_id", "claimed_by", "lease_expires_at"
    )[:limit]:
        with transaction.atomic():
            if not GpuPool.objects.filter(pk=pk, state=PoolState.PROVISIONING, lease_expires_at=lease).update(
                claimed_by="", lease_expires_at=lease_until(now)
            ):
                continue  # provisioned, failed or swept meanwhile
            why = f"worker lost (claim {claimed_by} expired)" if claimed_by else "not picked up (message lost)"
            PoolRequestTransition.objects.create(
                request_id=request_id,
                from_state=S.PROVISIONING,
                to_state=S.PROVISIONING,
                reason=f"provisioning re-queued: {why}",
                at=now,
            )
            from .tasks import provision_pool_task  # cycle: pools.tasks imports this module

            provision_pool_task.delay_on_commit(pk)
        logger.warning("pool %s: provisioning re-queued, %s", pk, why)
        swept.append(pk)
    return swept
