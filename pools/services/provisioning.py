"""A pool's provisioning bookkeeping: its share priority, claiming a run, marking the outcome, retrying, and
the sweep of runs that died. The Kubernetes work itself lives in pools/provisioning/."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from core.leases import lease_until

from .. import services
from ..choices import PoolState
from ..exceptions import IllegalTransition
from ..models import GpuPool, PoolCluster, PoolRequest, PoolRequestTransition
from .requests import S, _user, transition

logger = logging.getLogger(__name__)


def set_share_priority(pool: GpuPool, priority: str, *, actor=None) -> bool:
    """Set a time-sliced or MPS pool's share priority (operators) and reconcile its project on each of its clusters
    after commit, so the pool's ConfigMap names the new PriorityClass. True if it changed; idempotent.

    Raises ValueError for a pool whose units are not replicas of shared GPUs (no priority to give).
    """
    if not pool.is_shared:
        raise ValueError("Only time-sliced and MPS pools have a share priority.")
    from ..tasks import reconcile_project_task  # cycle: pools.tasks imports this module

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
            services.enqueue_provisioning(pool)
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
        services.enqueue_provisioning(pool)
    return pool


def pools_awaiting_cleanup(*, older_than_s: int = 300):
    """Released pools whose Kubernetes clean-up has not succeeded yet (for the periodic sweep)."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_s)
    return GpuPool.objects.filter(released_at__lte=cutoff, deprovisioned_at__isnull=True)


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
            from ..tasks import provision_pool_task  # cycle: pools.tasks imports this module

            provision_pool_task.delay_on_commit(pk)
        logger.warning("pool %s: provisioning re-queued, %s", pk, why)
        swept.append(pk)
    return swept
