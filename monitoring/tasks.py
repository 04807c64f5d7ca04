"""Celery tasks of the monitoring app: thin wrappers that load ids and call services.

poll_metrics_task (beat, every METRICS_INTERVAL_S) fans out one poll per NVML node, on that node's
own queue (node.<cluster>.<node>: its agent reads the local GPUs), and one DCGM scrape per cluster
that runs an exporter. Each carries the poll's slot time, so a redelivered or duplicated message
writes the same keys again (ignored). Messages expire after one period: a late poll is useless.
"""

from __future__ import annotations

from datetime import UTC, datetime

from celery import shared_task
from django.conf import settings
from django.db import transaction

from capacity.models import Cluster, NodeCapacity
from gpuaas.celery import node_queue
from monitoring.services import run_tracked
from monitoring.services.collect import poll_node, poll_slot, scrape_cluster
from monitoring.services.health import cordon_node
from monitoring.services.idle import detect_idle
from monitoring.services.retention import prune
from monitoring.services.rollups import run_rollups
from monitoring.services.timeslice import evict_over_share


def _slot_time(slot: int | None) -> datetime | None:
    return None if slot is None else datetime.fromtimestamp(slot, tz=UTC)


@shared_task(acks_late=True)
def poll_metrics_task() -> dict[str, int]:
    """Beat: queue this period's NVML polls (per node) and DCGM scrapes (per cluster)."""
    slot = int(poll_slot().timestamp())
    period = settings.METRICS_INTERVAL_S
    dcgm = list(Cluster.objects.exclude(dcgm_exporter_url="").order_by("pk").values_list("pk", flat=True))
    nodes = list(
        NodeCapacity.objects.present()
        .filter(gpu_count__gt=0)
        .filter(cluster__dcgm_exporter_url="")
        .order_by("pk")
        .values_list("pk", "cluster__name", "name")
    )

    def send():
        for cluster_id in dcgm:
            scrape_dcgm_task.apply_async((cluster_id, slot), expires=period)
        for node_id, cluster_name, node_name in nodes:
            poll_node_metrics_task.apply_async(
                (node_id, slot), queue=node_queue(cluster_name, node_name), expires=period
            )

    transaction.on_commit(send)
    return {"nodes": len(nodes), "dcgm_clusters": len(dcgm)}


@shared_task(acks_late=True)
def poll_node_metrics_task(node_id: int, slot: int | None = None) -> dict | None:
    """The node agent's poll (runs on the node's queue): NVML -> samples, health, share checks."""
    result = poll_node(node_id, at=_slot_time(slot))
    return None if result is None else result.summary()


@shared_task(acks_late=True)
def scrape_dcgm_task(cluster_id: int, slot: int | None = None) -> dict | None:
    """Scrape a cluster's DCGM exporters and record the readings."""
    result = scrape_cluster(cluster_id, at=_slot_time(slot))
    return None if result is None else result.summary()


@shared_task(bind=True, acks_late=True)
def rollup_metrics_task(self) -> dict:
    """Beat: 5-minute and hourly rollups of what arrived since the last run (idempotent upserts)."""
    return run_tracked("rollup", run_rollups, task_id=self.request.id or "").result


@shared_task(bind=True, acks_late=True)
def prune_metrics_task(self) -> dict:
    """Beat: delete samples and rollups past their retention, in batches."""
    return run_tracked("retention", prune, task_id=self.request.id or "").result


@shared_task(bind=True, acks_late=True)
def detect_idle_reservations_task(self) -> dict:
    """Beat: flag active allocations idle over the window; clear flags of busy or released ones."""
    return run_tracked("idle", detect_idle, task_id=self.request.id or "").result


@shared_task(acks_late=True)
def cordon_node_task(node_id: int, reason: str = "") -> bool:
    """Cordon a node whose GPU turned critical (MONITORING_CORDON_ON_CRITICAL)."""
    return cordon_node(node_id)


@shared_task(acks_late=True)
def evict_over_share_task(violation_id: int) -> str | None:
    """Evict a pod far above its share of a time-sliced GPU (MONITORING_EVICT_OVER_SHARE)."""
    return evict_over_share(violation_id)


@shared_task(acks_late=True)
def lend_idle_task() -> list[int]:
    """Beat: lend units idle for LENDING_IDLE_H to waiting requests of other projects (docs/queue.md)."""
    from monitoring.services.lending import lend_idle

    return lend_idle()
