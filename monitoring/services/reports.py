"""The control plane's side of node agents: check their signed reports and write many nodes at once.

A report (capacity/agent/protocol.py) says which node it is from and is signed with that node's key;
`ingest_reports` refuses any report whose signature does not match the node it names, whose node is
not a present node of that cluster, or whose slot lies in the future. A report that arrives after its poll
period is still written while its slot is within MONITORING_ROLLUP_LATENESS_S of now: every later rollup run
re-rolls the 5-minute buckets from its watermark minus that margin, so the late samples reach the rollups.
A report whose slot is older than that is dropped, and the samples it carried are counted on its node's
collector (`Collector.late_dropped_samples`), so what was lost to lateness is visible. Accepted reports are
mapped to rows (collect.map_nvml) and written together: per poll slot one bulk insert-or-ignore of every node's
samples (one COPY on PostgreSQL), one health pass, the time-sliced nodes' share checks, and one
upsert of the collectors. A redelivered report writes nothing twice: samples are keyed by
(ts, series), health events by (unit, rule), collectors by (cluster, source, target).

The ingest worker (monitoring/ingest/worker.py) calls this with a batch from the broker; `poll_node`
calls it with the one report it just read in-process (embedded demo, tests): one path either way.

A report also carries the fingerprint of its node's pod -> device set (the kubelet's PodResources `List`,
body.pods). Where it differs from the node's stored one (NodeCapacity.pods_digest), a pod started or stopped
on a GPU there: the new fingerprint is stored (one UPDATE for the batch) and, after commit, one discovery of
that node's cluster is queued, which mirrors the pod and has the node's agent read its devices: the trespass
check at the next poll sees it (within one poll, not one discovery interval). Nodes whose set did not change
cost a string comparison; a node's first fingerprint is only stored.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.agent import node as agent
from capacity.agent import protocol
from capacity.models import GpuCapacity, MigInstance, NodeCapacity
from capacity.tasks import queue_discovery
from monitoring.choices import MetricSource
from monitoring.models import Collector

from .collect import CollectResult, GpuRow, MigRow, NodeReading, map_nvml, poll_slot, vgpu_workloads, write_samples
from .health import apply_health
from .timeslice import check_node_shares

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class IngestOutcome:
    """What one batch did: per node its CollectResult, the samples written, the reports refused and why."""

    results: dict[int, CollectResult] = field(default_factory=dict)
    samples: int = 0
    refused: list[str] = field(default_factory=list)
    late_dropped_samples: int = 0  # units in reports past MONITORING_ROLLUP_LATENESS_S (dropped, counted)

    def summary(self) -> dict:
        return {
            "nodes": len(self.results),
            "samples": self.samples,
            "refused": len(self.refused),
            "late_dropped_samples": self.late_dropped_samples,
        }


def poll_node(node_id: int, *, at: datetime | None = None) -> CollectResult | None:
    """One node's poll in this process (embedded demo, tests): the agent's read, then the ingest of its report.

    The same two functions a node agent and the ingest worker run across the broker. None if the node is gone.
    """
    node = NodeCapacity.objects.select_related("cluster").filter(pk=node_id, gone_at__isnull=True).first()
    if node is None:
        return None
    report = agent.read_metrics(
        node.cluster.name, node.name, api_url=kube.api_url_for(node.cluster), slot=int(poll_slot(at).timestamp())
    )
    # The slot is this call's own choice (tests poll at chosen times): no window to check.
    return ingest_reports([report], window=False).results.get(node.pk)


def ingest_reports(reports: list, *, window: bool = True) -> IngestOutcome:
    """Check and write a batch of node agents' reports (see the module doc). Refusals are logged, not raised.

    `window=False` skips the slot-window check (only for a report this process has just read itself).
    """
    outcome = IngestOutcome()
    accepted, late = _accepted(reports, outcome, window=window)
    if not accepted and not late:
        return outcome
    nodes = _present_nodes({(r["cluster"], r["node"]) for r, *_ in accepted + late})
    _record_late(late, nodes, outcome)
    if not accepted:
        _log_refused(outcome)
        return outcome
    gpus, instances = _units(nodes.values())
    hosts = {nodes.get((r["cluster"], r["node"])) for r, readings, *_ in accepted if any(g.vgpus for g in readings)}
    vms = vgpu_workloads([n.pk for n in hosts if n is not None]) if hosts - {None} else {}
    by_slot: dict[datetime, list[tuple[NodeReading, int]]] = defaultdict(list)
    for report, readings, error, elapsed_ms in accepted:
        node = nodes.get((report["cluster"], report["node"]))
        if node is None:
            outcome.refused.append(f"{report['cluster']}/{report['node']}: not a present node of that cluster")
            continue
        ts = datetime.fromtimestamp(report["slot"], tz=UTC)
        if error:
            reading = NodeReading(node, result=CollectResult(error=error))
        else:
            reading = map_nvml(node, readings, gpus.get(node.pk, []), instances.get(node.pk, []), vms.get(node.pk))
        by_slot[ts].append((reading, elapsed_ms))
        outcome.results[node.pk] = reading.result
    for ts, batch in sorted(by_slot.items()):
        outcome.samples += _write(ts, [reading for reading, _ in batch])
    _record_collectors([pair for batch in by_slot.values() for pair in batch])
    NodeCapacity.objects.record_agent_reports(
        {
            nodes[(r["cluster"], r["node"])].pk: protocol.reported_version(r["body"])
            for r, *_ in accepted
            if (r["cluster"], r["node"]) in nodes
        },
        timezone.now(),
    )
    _note_pod_changes(accepted, nodes)
    _log_refused(outcome)
    return outcome


def _log_refused(outcome: IngestOutcome) -> None:
    for reason in outcome.refused:
        logger.warning("node agent report refused: %s", reason)


def _record_late(late: list, nodes: dict[tuple[str, str], NodeCapacity], outcome: IngestOutcome) -> None:
    """Count the samples of reports past the lateness window on their nodes' collectors (created if missing):
    one UPDATE per distinct count (a fleet has few), never per node. Reports of unknown nodes count nothing."""
    by_node: dict[int, int] = defaultdict(int)
    for report, readings, *_ in late:
        node = nodes.get((report["cluster"], report["node"]))
        if node is None:
            continue
        units = sum(1 + len(r.mig) + len(r.vgpus) for r in readings if not r.lost)
        by_node[node.pk] += units
        outcome.late_dropped_samples += units
    if not by_node:
        return
    present = {n.pk: n for n in nodes.values()}
    Collector.objects.bulk_create(
        [
            Collector(cluster_id=present[pk].cluster_id, node_id=pk, source=MetricSource.NVML, target=present[pk].name)
            for pk in sorted(by_node)
        ],
        ignore_conflicts=True,
    )
    by_count: dict[int, list[int]] = defaultdict(list)
    for pk, units in by_node.items():
        by_count[units].append(pk)
    for units, pks in sorted(by_count.items()):
        Collector.objects.filter(source=MetricSource.NVML, node_id__in=sorted(pks)).update(
            late_dropped_samples=F("late_dropped_samples") + units
        )


def _note_pod_changes(accepted: list, nodes: dict[tuple[str, str], NodeCapacity]) -> list[int]:
    """Store the nodes' new pod -> device fingerprints; queue one discovery per cluster where one changed
    (after commit). Returns the clusters queued."""
    digests: dict[int, str] = {}
    clusters: set[int] = set()
    for report, *_ in accepted:
        node = nodes.get((report["cluster"], report["node"]))
        digest = report["body"].get("pods")
        if node is None or digest is None or digest == node.pods_digest:
            continue
        digests[node.pk] = digest
        if node.pods_digest:  # a first fingerprint says nothing changed
            clusters.add(node.cluster_id)
        node.pods_digest = digest
    if digests:
        NodeCapacity.objects.filter(pk__in=digests).update(
            pods_digest=Case(*(When(pk=pk, then=Value(d)) for pk, d in digests.items()), default="pods_digest")
        )
    for cluster_id in sorted(clusters):
        transaction.on_commit(lambda cluster_id=cluster_id: queue_discovery(cluster_id))
    return sorted(clusters)


Checked = tuple[dict, list, str, int]  # (report, readings, error, elapsed_ms)


def _accepted(reports: list, outcome: IngestOutcome, *, window: bool) -> tuple[list[Checked], list[Checked]]:
    """(accepted, late): the reports with a valid signature, a well-formed body and a slot in the window, and
    those whose slot is older than MONITORING_ROLLUP_LATENESS_S (dropped; the caller counts them). Both kinds
    of refusal are noted in outcome.refused."""
    now = timezone.now()
    newest = poll_slot(now).timestamp() + settings.METRICS_INTERVAL_S
    oldest = (now - timedelta(seconds=settings.MONITORING_ROLLUP_LATENESS_S)).timestamp()
    accepted, late = [], []
    for report in reports:
        try:
            protocol.verify(report)
            if report["kind"] != protocol.KIND_METRICS:
                raise protocol.BadReport(f"kind {report['kind']!r} is not ingested here")
            if window and report["slot"] > newest:
                raise protocol.BadReport(f"slot {report['slot']} is in the future")
            readings, error, elapsed_ms = protocol.metrics_from_body(report["body"])
        except protocol.BadReport as exc:
            who = f"{report.get('cluster')}/{report.get('node')}" if isinstance(report, dict) else "?"
            outcome.refused.append(f"{who}: {exc}")
            continue
        if window and report["slot"] < oldest:
            outcome.refused.append(
                f"{report['cluster']}/{report['node']}: slot {report['slot']} is past the lateness window"
                f" (MONITORING_ROLLUP_LATENESS_S={settings.MONITORING_ROLLUP_LATENESS_S})"
            )
            late.append((report, readings, error, elapsed_ms))
            continue
        accepted.append((report, readings, error, elapsed_ms))
    return accepted, late


def _present_nodes(names: set[tuple[str, str]]) -> dict[tuple[str, str], NodeCapacity]:
    """(cluster name, node name) -> the present node row, in one query."""
    match = Q()
    by_cluster: dict[str, set[str]] = defaultdict(set)
    for cluster, node in names:
        by_cluster[cluster].add(node)
    for cluster, node_names in by_cluster.items():
        match |= Q(cluster__name=cluster, name__in=node_names)
    rows = NodeCapacity.objects.present().filter(match).select_related("cluster")
    return {(n.cluster.name, n.name): n for n in rows}


def _units(nodes) -> tuple[dict[int, list[GpuRow]], dict[int, list[MigRow]]]:
    """The present GPUs and active MIG instances of these nodes, by node id: two queries for the batch, and
    only the columns the mapping, the health rules and the share checks read, as plain rows (a batch is
    thousands of units: model instances cost more than the queries)."""
    ids = sorted(n.pk for n in nodes)
    gpus: dict[int, list[GpuRow]] = defaultdict(list)
    for row in GpuCapacity.objects.filter(node_id__in=ids, lost_at__isnull=True).values_list(*_GPU_COLUMNS):
        gpu = GpuRow(*row)
        gpus[gpu.node_id].append(gpu)
    instances: dict[int, list[MigRow]] = defaultdict(list)
    query = MigInstance.objects.active().filter(gpu__node_id__in=ids, gpu__lost_at__isnull=True)
    for node_id, *row in query.values_list("gpu__node_id", *_MIG_COLUMNS):
        instances[node_id].append(MigRow(*row))
    return gpus, instances


_GPU_COLUMNS = ("id", "node_id", "index", "uuid", "product", "catalog_product", "memory_mib")
_MIG_COLUMNS = ("id", "gpu_id", "gi_id", "uuid", "profile__compute_slices", "profile__name")


def _write(ts: datetime, readings: list[NodeReading]) -> int:
    """One slot's rows of every node in the batch: samples in one insert, health in one pass, shares in one."""
    samples = write_samples([s for r in readings for s in r.samples], ts=ts, source=MetricSource.NVML)
    health = apply_health([h for r in readings for h in r.health], at=ts, source=MetricSource.NVML)
    shares = check_node_shares([(r.node, r.shared) for r in readings if r.shared], at=ts)
    for reading in readings:
        reading.result.samples = len(reading.samples)
        reading.result.health = health  # the batch's outcome: events are not attributed per node
        reading.result.share_violations = shares.get(reading.node.pk, 0)
    return samples


def _record_collectors(readings: list[tuple[NodeReading, int]]) -> None:
    """Upsert the Collector row of every node in the batch (two statements: with and without a success)."""
    now = timezone.now()
    rows = {True: {}, False: {}}
    for reading, elapsed_ms in readings:
        result = reading.result
        node = reading.node
        rows[not result.error][node.pk] = Collector(
            cluster_id=node.cluster_id,
            node=node,
            source=MetricSource.NVML,
            target=node.name[:500],
            last_attempt_at=now,
            last_success_at=None if result.error else now,
            last_samples=result.samples,
            last_duration_ms=max(0, elapsed_ms),
            last_error=result.error[:2000],
        )
    fields = ["node", "last_attempt_at", "last_samples", "last_duration_ms", "last_error"]
    for ok, by_node in rows.items():
        if by_node:
            Collector.objects.bulk_create(
                [by_node[pk] for pk in sorted(by_node)],
                update_conflicts=True,
                unique_fields=["cluster", "source", "target"],
                update_fields=fields + (["last_success_at"] if ok else []),
            )


def missing_nodes(ts: datetime) -> list[tuple[int, str, str]]:
    """(cluster id, cluster name, node name) of the NVML-polled nodes with no report ingested since `ts`.

    Every ingested report (a failed read too) stamps its collector's last_attempt_at.
    """
    reported = Collector.objects.filter(source=MetricSource.NVML, node__isnull=False, last_attempt_at__gte=ts)
    return list(
        NodeCapacity.objects.nvml_polled()
        .exclude(pk__in=reported.values("node_id"))
        .values_list("cluster_id", "cluster__name", "name")
    )
