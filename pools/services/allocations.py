"""A pool's units as they end or move: release, expiry, rehoming after a MIG instance is destroyed, and moves."""

from __future__ import annotations

import copy
import datetime as dt
import logging

from django.db import IntegrityError, transaction
from django.utils import timezone

from capacity.choices import Binding
from capacity.models import Cluster, MigInstance, MigReconfiguration
from policies import policy

from .. import ending, services, signals, units
from ..exceptions import IllegalTransition
from ..models import Allocation, PoolRequest, PoolRequestTransition
from .requests import S, release

logger = logging.getLogger(__name__)


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
        services.enqueue_queue_processing()
    return True


# --- Expiry --------------------------------------------------------------------------------------


def expire_due(*, now: dt.datetime | None = None, notice_s: int | None = None, limit: int = 500) -> dict[str, int]:
    """Give notice to, then expire, requests whose end has come. Idempotent; safe to run concurrently.

    A holding request whose end is within `notice_s` (default: the POOL_EXPIRY_NOTICE_S policy) gets a notice:
    expiry_notice_at is claimed with a conditional UPDATE and an audit row (state unchanged, reason
    "expiry notice") is written. It expires once its end has passed AND the notice is at least
    `notice_s` old, so a project always gets the full notice, even after an outage of the beat.
    """
    now = now or timezone.now()
    notice_s = policy("POOL_EXPIRY_NOTICE_S") if notice_s is None else notice_s
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
    from ..tasks import reconcile_project_task  # cycle: pools.tasks imports this module

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
