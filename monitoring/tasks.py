"""Celery tasks of the monitoring app: thin wrappers that load ids and call services.

poll_metrics_task (beat, every METRICS_INTERVAL_S) fans out one read per NVML node, on that node's
own queue (node.<cluster>.<node>: its agent, which has no database, reads the local GPUs and
publishes a signed report on the ingest queue; capacity/agent/), and one DCGM scrape per cluster
that runs an exporter. Each carries the poll's slot time, so a redelivered or duplicated message
writes the same keys again (ignored). A read expires after one period: one its agent has not started by
then is dropped (the next period's read replaces it), one started is finished and its report published.
The reports are written by the ingest worker (`manage.py ingest-worker`, monitoring/ingest/worker.py), late
ones too while their slot is within MONITORING_ROLLUP_LATENESS_S (monitoring/services/reports.py).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from celery import shared_task
from django.conf import settings
from django.db import transaction

from capacity.adapters import kubernetes as kube
from capacity.agent import transport
from capacity.agent.tasks import read_node_metrics_task
from capacity.models import Cluster, NodeCapacity
from core.celery import node_queue
from monitoring.services import run_tracked
from monitoring.services.collect import poll_slot, scrape_cluster
from monitoring.services.health import cordon_node
from monitoring.services.idle import detect_idle
from monitoring.services.lending import lend_idle
from monitoring.services.reports import missing_nodes
from monitoring.services.retention import prune
from monitoring.services.rollups import run_rollups
from monitoring.services.timeslice import evict_over_share
from monitoring.services.trespass import detect_trespass, evict_trespasser

logger = logging.getLogger(__name__)


def _slot_time(slot: int | None) -> datetime | None:
    return None if slot is None else datetime.fromtimestamp(slot, tz=UTC)


@shared_task(acks_late=True)
def poll_metrics_task() -> dict[str, int]:
    """Beat: queue this period's NVML polls (per node) and DCGM scrapes (per cluster)."""
    slot = int(poll_slot().timestamp())
    period = settings.METRICS_INTERVAL_S
    dcgm = list(Cluster.objects.exclude(dcgm_exporter_url="").order_by("pk").values_list("pk", flat=True))
    clusters = list(Cluster.objects.order_by("pk").values_list("pk", flat=True))
    nodes = list(NodeCapacity.objects.nvml_polled().values_list("cluster_id", "cluster__name", "name"))

    def send():
        for cluster_id in dcgm:
            scrape_dcgm_task.apply_async((cluster_id, slot), expires=period)
        send_reads(nodes, slot, expires=period)
        repoll_missing_task.apply_async((slot,), countdown=settings.METRICS_REPOLL_AFTER_S, expires=period)
        for cluster_id in clusters:
            detect_trespass_task.apply_async((cluster_id, slot), expires=period)

    transaction.on_commit(send)
    return {"nodes": len(nodes), "dcgm_clusters": len(dcgm), "trespass_checks": len(clusters)}


def send_reads(nodes: list[tuple[int, str, str]], slot: int, *, expires: float) -> None:
    """One read_node_metrics_task per (cluster id, cluster name, node name) on the node's own queue."""
    api_urls = {c.pk: kube.api_url_for(c) for c in Cluster.objects.filter(pk__in={n[0] for n in nodes})}
    for cluster_id, cluster_name, node_name in nodes:
        read_node_metrics_task.apply_async(
            (cluster_name, node_name, api_urls[cluster_id], slot),
            queue=node_queue(cluster_name, node_name),
            expires=expires,
        )


@shared_task(acks_late=True)
def repoll_missing_task(slot: int) -> int:
    """Once per period, METRICS_REPOLL_AFTER_S after the fan-out: ask the nodes that have not reported since
    `slot` began again (sent with the fan-out; it expires with the period, so a late one does nothing).

    Their first read may have died with its agent (the message is then unacknowledged for Redis's
    visibility timeout, far past its expiry). A node whose read is merely slow is read twice; its second
    report writes nothing new (insert-or-ignore). The reads expire with the period. Returns how many nodes
    were asked again.

    Not while ingest is behind (at least AGENT_INGEST_BATCH reports queued): the missing nodes' reports are
    then most likely in that queue, and reading them again would only lengthen it (an overrun would feed on
    itself). A read that died with its agent is then not asked again this period; the next period reads it.
    """
    waiting = transport.backlog()
    if waiting is not None and waiting >= settings.AGENT_INGEST_BATCH:
        logger.warning("re-poll of slot %s skipped: %d reports wait on the ingest queue", slot, waiting)
        return 0
    nodes = missing_nodes(_slot_time(slot))
    send_reads(nodes, slot, expires=settings.METRICS_INTERVAL_S - settings.METRICS_REPOLL_AFTER_S)
    return len(nodes)


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
def detect_trespass_task(cluster_id: int, slot: int | None = None) -> dict | None:
    """Once per poll and cluster: open, keep and end trespass events (monitoring/services/trespass.py)."""
    result = detect_trespass(cluster_id, at=_slot_time(slot))
    return None if result is None else result.summary()


def queue_trespass_check(sender, cluster_id: int, **kwargs) -> None:
    """capacity.signals.workloads_attributed: a pod's devices changed, so check the cluster now (after commit),
    not at the next poll: a new trespasser shows within the poll whose read saw it (docs/monitoring.md)."""
    transaction.on_commit(lambda: detect_trespass_task.delay(cluster_id))


@shared_task(acks_late=True)
def evict_trespass_task(event_id: int) -> str:
    """Evict a trespassing pod through the Eviction API (MONITORING_EVICT_TRESPASS)."""
    return evict_trespasser(event_id)


@shared_task(acks_late=True)
def lend_idle_task() -> list[int]:
    """Beat: lend units idle for LENDING_IDLE_H to waiting requests of other projects (docs/queue.md)."""
    return lend_idle()
