"""Celery tasks of the pools app: thin, idempotent, ids in; the work is in services and provisioning."""

from __future__ import annotations

from celery import shared_task

from capacity.adapters.kubernetes import KubernetesError
from capacity.models import Cluster
from tenancy.models import Project

from .choices import PoolState
from .ending import sweep_ending
from .lending import evict_returned, reconcile_loans
from .models import Allocation, GpuPool
from .provisioning import deprovision_pool, provision_pool, reconcile, reconcile_provisioned
from .services import expire_due, pools_awaiting_cleanup, sweep_provisioning

# Clean-ups re-enqueued per beat run, so a long outage does not flood the queue at once.
CLEANUP_BATCH = 200


@shared_task(acks_late=True)
def provision_pool_task(pool_id: int) -> str | None:
    """Provision a pool in Kubernetes (namespace, quota, node labels); no-op unless it is provisioning."""
    pool = GpuPool.objects.select_related("project", "cluster").filter(pk=pool_id).first()
    if pool is None or pool.state != PoolState.PROVISIONING:
        return None
    return provision_pool(pool, task_id=provision_pool_task.request.id or "")


@shared_task(acks_late=True)
def deprovision_pool_task(pool_id: int) -> bool | None:
    """Remove a released pool's quota and node labels; no-op unless released and not yet cleaned up."""
    pool = GpuPool.objects.select_related("project", "cluster").filter(pk=pool_id).first()
    if pool is None or pool.released_at is None or pool.deprovisioned_at is not None:
        return None
    return deprovision_pool(pool)


@shared_task(acks_late=True)
def expire_requests_task() -> dict[str, int]:
    """Beat: give expiry notices, expire requests past their end, and retry failed clean-ups."""
    result = expire_due()
    stale = list(pools_awaiting_cleanup().order_by("pk").values_list("pk", flat=True)[:CLEANUP_BATCH])
    for pool_id in stale:
        deprovision_pool_task.delay(pool_id)
    result["cleanups_enqueued"] = len(stale)
    return result


@shared_task(acks_late=True)
def sweep_provisioning_task() -> int:
    """Beat (every WORKFLOW_SWEEP_S): re-enqueue provisioning whose lease ran out (worker died, message lost)."""
    return len(sweep_provisioning())


@shared_task(acks_late=True)
def reconcile_pools_task() -> dict[str, int]:
    """Beat (every POOL_RECONCILE_INTERVAL_S): re-apply quotas, labels and namespaces that drifted."""
    return reconcile_provisioned()


@shared_task(acks_late=True)
def reconcile_project_task(project_id: int, cluster_id: int) -> bool:
    """After a single unit was released: make the project's quota and labels match (idempotent)."""
    project = Project.objects.filter(pk=project_id).first()
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if project is None or cluster is None:
        return False
    try:
        reconcile(project, cluster)
    except KubernetesError as exc:
        raise reconcile_project_task.retry(exc=exc, countdown=60, max_retries=5) from None
    return True


@shared_task(acks_late=True)
def reconcile_loans_task() -> dict[str, int]:
    """Beat: take lent units back where lenders need them, after the grace period (pools/lending.py)."""
    totals: dict[str, int] = {}
    # The lent unit's cluster, not the lender pool's home: a pool may span clusters.
    lending = Cluster.objects.filter(nodes__gpus__allocations__loans__state__in=["active", "reclaiming"])
    for cluster in lending.distinct().order_by("pk"):
        try:
            for key, value in reconcile_loans(cluster).items():
                totals[key] = totals.get(key, 0) + value
        except KubernetesError:
            totals["failed"] = totals.get("failed", 0) + 1  # the next beat retries
    return totals


@shared_task(acks_late=True)
def evict_returned_loans_task(loan_ids: list[int]) -> int:
    """After loans ended without a reclaim (the borrower approved, withdrawn or done; a best-effort request
    ended): evict the borrower's low-priority pods left on the returned units (pools.lending.evict_returned)."""
    try:
        return evict_returned(loan_ids)
    except KubernetesError as exc:
        raise evict_returned_loans_task.retry(exc=exc, countdown=60, max_retries=10) from None


@shared_task(acks_late=True)
def sweep_ending_task() -> dict[str, int]:
    """Beat (every ALLOCATION_ENDING_SWEEP_S): evict the pods left on ended units after the grace period and
    mark the units empty (pools/ending.py). Per cluster; an unreachable cluster waits for the next beat."""
    totals: dict[str, int] = {}
    ending = Allocation.objects.ending().values("gpu__node__cluster")
    for cluster in Cluster.objects.filter(pk__in=ending).order_by("pk"):
        for key, value in sweep_ending(cluster).summary().items():
            totals[key] = totals.get(key, 0) + value
    return totals
