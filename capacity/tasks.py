"""Celery tasks of the capacity app: thin wrappers that load ids and call services.

Discovery (this block): discover_all_task (beat, every DISCOVERY_INTERVAL_S) fans out one
discover_cluster_task per cluster on the `discovery` queue, so one failing cluster never holds up
the others; discovery enqueues the agent's inventory read (read_node_inventory_task) on each new
or changed node's own queue (node.<cluster>.<node>); the agent publishes its signed report on the
ingest queue and the ingest worker reconciles it.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import transaction

from capacity.adapters import kubernetes as kube
from capacity.adapters.kubernetes import KubernetesError
from capacity.agent.tasks import read_node_inventory_task
from capacity.models import Cluster
from capacity.services.discovery import discover_cluster
from capacity.services.mig_configs import apply_time_slicing, write_mig_parted_config
from capacity.services.tiers import reconcile_tier_labels
from core.celery import node_queue

logger = logging.getLogger(__name__)

# --- Discovery --------------------------------------------------------------------------------

# A node agent that is down must not find a pile of stale inventory requests when it comes back.
INVENTORY_EXPIRES_S = 10 * 60


@shared_task(acks_late=True)
def discover_all_task() -> int:
    """Queue one discovery per registered cluster; returns how many were queued."""
    ids = list(Cluster.objects.order_by("pk").values_list("pk", flat=True))
    transaction.on_commit(lambda: [queue_discovery(pk) for pk in ids])
    return len(ids)


def queue_discovery(cluster_id: int) -> None:
    """Send discover_cluster_task for one cluster; expires after one discovery period."""
    discover_cluster_task.apply_async((cluster_id,), expires=settings.DISCOVERY_INTERVAL_S)


@shared_task(bind=True, acks_late=True)
def discover_cluster_task(self, cluster_id: int) -> str | None:
    """Discover one cluster (Kubernetes lists, then node-agent inventory on new/changed nodes).

    Idempotent: a repeated or duplicated run writes nothing new. Kubernetes failures are recorded
    on the DiscoveryRun and the Cluster row, not raised, so they are not retried here: the next
    beat tick is the retry.
    """
    if not Cluster.objects.filter(pk=cluster_id).exists():
        return None
    outcome = discover_cluster(cluster_id, task_id=self.request.id or "")
    return outcome.run.status


def enqueue_inventory(cluster_id: int, cluster_name: str, node_names: list[str]) -> None:
    """Send the agent's inventory read to each node's queue (call after commit); the report comes back
    through the ingest queue (capacity.services.inventory.ingest_inventory_reports)."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return
    api_url = kube.api_url_for(cluster)
    for name in node_names:
        read_node_inventory_task.apply_async(
            (cluster_name, name, api_url), queue=node_queue(cluster_name, name), expires=INVENTORY_EXPIRES_S
        )


# --- Time-slicing and the mig-parted ConfigMap (capacity.services.mig_configs) ----------------------
# The MIG reconfiguration tasks live in operations.tasks (under their old capacity.tasks.* names).


@shared_task(acks_late=True)
def apply_time_slicing_task(cluster_id: int) -> dict | None:
    """Write the cluster's time-slicing ConfigMap keys and node labels. Idempotent."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return None
    try:
        return apply_time_slicing(cluster)
    except KubernetesError as exc:  # recorded on the policies (last_error); the admin action re-queues
        return {"error": str(exc)}


@shared_task(acks_late=True)
def write_mig_parted_config_task(cluster_id: int) -> int | None:
    """Rewrite gpuaas's mig-parted ConfigMap of one cluster from the database; returns the config count."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return None
    return len(write_mig_parted_config(cluster)["mig-configs"])


# --- Tier labels ------------------------------------------------------------------------------


@shared_task(acks_late=True)
def reconcile_tier_labels_task(cluster_id: int) -> dict | None:
    """Write or restore the `gpuaas.io/tier` label of every assigned node of one cluster. Idempotent."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return None
    try:
        return reconcile_tier_labels(cluster)
    except KubernetesError as exc:  # recorded on the assignments (last_error); the next beat retries
        return {"error": str(exc)}


@shared_task(acks_late=True)
def reconcile_all_tier_labels_task() -> int:
    """Beat: one reconcile per cluster with assigned nodes."""
    ids = list(Cluster.objects.filter(nodes__tier_assignment__isnull=False).values_list("pk", flat=True).distinct())
    for cluster_id in ids:
        reconcile_tier_labels_task.apply_async((cluster_id,), expires=settings.DISCOVERY_INTERVAL_S)
    return len(ids)
