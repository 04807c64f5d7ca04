"""Node-agent inventory: what NVML says about a node's GPUs, reconciled into the database.

A node agent reads the node's NVML (read_node_inventory_task on the node's own queue,
capacity/agent/) and publishes a signed report; the ingest worker passes the reports to
`ingest_inventory_reports`, which checks them and reconciles. `inventory_node(cluster_id, node_name)`
does both in this process (the same read and reconcile). The reconcile writes
- GpuCapacity, by UUID: product, catalog key, memory, MIG mode, driver/CUDA, serial, PCI bus id.
  A GPU NVML reports lost (GpuIsLost), or that is no longer enumerated, gets health "lost" and
  lost_at; it is never deleted. A lost GPU seen again healthy is back (lost_at cleared).
- MigInstance, by MIG device UUID: profile and placement (MigPlacement row) from the GPU
  instance's info, GI and CI ids. An instance no longer reported becomes state "gone".
- WorkloadProfile rows of device-plugin pods on the node: their devices, exactly as the kubelet's
  PodResources API lists them (every device of every resource the pod holds; `attribute_workloads`),
  matched by node, namespace, pod name and resource. Where the kubelet could not be asked (socket
  missing, permission denied: the node's `inventory_error` says so), rows still without a device get
  one from NVML process -> pod UID facts.
A partial read changes nothing it did not read: a GPU NVML failed part-way through (`unread`)
keeps its row and its MIG instances, and a MIG device whose placement an unprivileged agent could
not read (NVML_ERROR_NO_PERMISSION) keeps its recorded instance; the node's `warnings` say why.

`inventory_nodes()` does the same for many nodes with one reconcile (simulator, benchmark).
Locking: the cluster row (FOR NO KEY UPDATE) for the write phase, like discovery; NVML is read
before the transaction. Idempotent: a repeated or concurrent inventory upserts the same rows.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Case, Value, When
from django.utils import timezone

from capacity import signals
from capacity.adapters import kubernetes as kube
from capacity.adapters import nvml, podresources
from capacity.agent import node as agent
from capacity.agent import protocol
from capacity.choices import GpuHealth, MigInstanceState
from capacity.mig.catalog import find_product
from capacity.models import Cluster, GpuCapacity, MigInstance, MigPlacement, MigProfile, NodeCapacity

from . import bulk
from .device_holders import attribute_workloads, resolve_workloads

logger = logging.getLogger(__name__)

GPU_FIELDS = ("node_id", "index", *GpuCapacity.REPORTED_FIELDS, "nvlink_group", "pcie_group", "numa_group")
MIG_FIELDS = ("gpu_id", "profile_id", "placement_id", "placement_start", "placement_size", "gi_id", "ci_id")
_GPU_UPDATE = [*GPU_FIELDS, "last_seen_at", "lost_at"]
_MIG_UPDATE = [*MIG_FIELDS, "state", "last_seen_at", "gone_at"]
# An inventory report older than this is refused (discovery asks again; its messages expire after 10 minutes).
INVENTORY_MAX_AGE_S = 15 * 60
# Above this many nodes, rows are loaded for the whole cluster rather than by node id list.
_BY_CLUSTER = 50
# A GPU seen again after it was lost starts healthy: its other health comes from later events, not the old row.
_STARTS_HEALTHY = frozenset({GpuHealth.LOST})


@dataclass
class InventoryResult:
    nodes: int = 0
    workloads_attributed: int = 0  # rows whose devices PodResources set or changed
    gpus: int = 0
    gpus_written: int = 0
    gpus_lost: int = 0
    mig_instances: int = 0
    mig_written: int = 0
    mig_gone: int = 0
    workloads_resolved: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    warnings: dict[str, list[str]] = field(default_factory=dict)  # node -> what NVML could not read


def inventory_node(cluster_id: int, node_name: str, *, api_url: str | None = None) -> InventoryResult:
    """Read one node's NVML and reconcile it. A gone or unknown node is skipped (returns an empty result)."""
    cluster = Cluster.objects.get(pk=cluster_id)
    if not NodeCapacity.objects.for_cluster(cluster).present().filter(name=node_name).exists():
        return InventoryResult()
    return inventory_nodes(
        cluster_id, [node_name], api_url=api_url if api_url is not None else kube.api_url_for(cluster)
    )


def inventory_nodes(cluster_id: int, node_names: list[str], *, api_url: str) -> InventoryResult:
    """Read NVML of each node in this process, as its agent would (failures are reported per node, not
    raised), then reconcile all at once: the agent's read and the ingest worker's reconcile, one path."""
    cluster_name = Cluster.objects.values_list("name", flat=True).get(pk=cluster_id)
    return reconcile_reports(
        cluster_id, [agent.read_inventory(cluster_name, name, api_url=api_url) for name in node_names]
    )


def reconcile_reports(cluster_id: int, reports: list[dict]) -> InventoryResult:
    """Inventory reports of one cluster's nodes (verified, or read in this process): failed reads and partial
    ones are noted per node, the rest reconciled in one transaction, which also dates each node's rows with
    its read (NodeCapacity.inventory_read_at: the MIG verify step waits for a read made after the change)."""
    result = InventoryResult()
    inventories = []
    read_at: dict[str, datetime] = {}
    versions: dict[str, str] = {}  # node -> the release its agent reported (NodeCapacity.agent_version)
    held: dict[str, podresources.PodResourcesReading] = {}
    unattributed: dict[str, str] = {}  # node -> why its kubelet could not be asked (shown as its inventory_error)
    for report in reports:
        name = report["node"]
        inventory, error = protocol.inventory_from_body(report["body"], name)
        reading = protocol.pod_resources_from_body(report["body"])
        if reading is not None:
            notes = [f"kubelet PodResources: {text}" for text in ([reading.error] if reading.error else [])]
            notes += [f"kubelet PodResources: {text}" for text in reading.warnings]
            if notes:
                result.warnings.setdefault(name, []).extend(notes)
            if reading.error:
                unattributed[name] = notes[0]
                logger.warning("PodResources of %s could not be read: %s", name, reading.error)
            else:
                held[name] = reading
        if inventory is None:
            result.errors[name] = error
            logger.warning("inventory of %s failed: %s", name, error)
            continue
        inventories.append(inventory)
        read_at[name] = datetime.fromtimestamp(report["slot"], tz=UTC)
        versions[name] = protocol.reported_version(report["body"])
        if inventory.warnings:
            result.warnings.setdefault(name, []).extend(inventory.warnings)
            for warning in inventory.warnings:
                logger.warning("inventory of %s is partial: %s", name, warning)
    nodes = NodeCapacity.objects.filter(cluster_id=cluster_id, gone_at__isnull=True)
    with transaction.atomic():
        reconcile_inventory(cluster_id, inventories, result=result, attributed_by_kubelet=set(held))
        if held:
            attribute_workloads(cluster_id, held, result)
        if read_at:
            errors = {name: unattributed.get(name, "")[:500] for name in read_at}
            nodes.filter(name__in=read_at).update(
                inventory_read_at=_by_name(read_at),
                inventory_error=_by_name(errors),
                agent_reported_at=timezone.now(),
                agent_version=_by_name(versions),
            )
        if result.errors:
            nodes.filter(name__in=result.errors).update(
                inventory_error=_by_name({name: error[:500] for name, error in result.errors.items()})
            )
    return result


def _by_name(values: dict) -> Case:
    """A CASE on the node's name, so one UPDATE sets each node its own value."""
    return Case(*(When(name=name, then=Value(value)) for name, value in values.items()))


def ingest_inventory_reports(reports: list) -> tuple[dict[str, InventoryResult], list[str]]:
    """Node agents' inventory reports from the ingest queue: each must be signed by the node it names, be of a
    present node of a registered cluster, and be at most INVENTORY_MAX_AGE_S old. Per cluster name its
    result, and the refusals (logged)."""
    refused: list[str] = []
    by_cluster: dict[str, list[dict]] = defaultdict(list)
    now = time.time()
    for report in reports:
        try:
            protocol.verify(report)
            if report["kind"] != protocol.KIND_INVENTORY:
                raise protocol.BadReport(f"kind {report['kind']!r} is not an inventory")
            if not now - INVENTORY_MAX_AGE_S <= report["slot"] <= now + 60:
                raise protocol.BadReport(f"read at {report['slot']}: outside the accepted window")
            protocol.inventory_from_body(report["body"], report["node"])
        except protocol.BadReport as exc:
            who = f"{report.get('cluster')}/{report.get('node')}" if isinstance(report, dict) else "?"
            refused.append(f"{who}: {exc}")
            continue
        by_cluster[report["cluster"]].append(report)
    results = {}
    for cluster in Cluster.objects.filter(name__in=by_cluster).order_by("pk"):
        present = set(
            NodeCapacity.objects.for_cluster(cluster)
            .present()
            .filter(name__in=[r["node"] for r in by_cluster[cluster.name]])
            .values_list("name", flat=True)
        )
        refused += [
            f"{cluster.name}/{r['node']}: not a present node"
            for r in by_cluster[cluster.name]
            if r["node"] not in present
        ]
        results[cluster.name] = reconcile_reports(
            cluster.pk, [r for r in by_cluster[cluster.name] if r["node"] in present]
        )
    refused += [f"{name}/*: no registered cluster of that name" for name in by_cluster if name not in results]
    for reason in refused:
        logger.warning("node agent inventory refused: %s", reason)
    return results, refused


def reconcile_inventory(
    cluster_id: int,
    inventories: list[nvml.NodeInventory],
    *,
    now: datetime | None = None,
    result=None,
    attributed_by_kubelet: set[str] = frozenset(),
) -> InventoryResult:
    """Write NVML inventories of some of the cluster's nodes into GpuCapacity/MigInstance (one transaction).

    `attributed_by_kubelet`: nodes whose kubelet listed their pods' devices (PodResources): NVML's process list
    attributes no workload there (the kubelet's answer is the truth; a pod it does not list has no device yet)."""
    result = result or InventoryResult()
    if not inventories:
        return result
    now = now or timezone.now()
    with transaction.atomic():
        Cluster.objects.select_for_update(no_key=True).filter(pk=cluster_id).values_list("pk").get()
        names = {inv.node_name for inv in inventories}
        # Only which rows SQL reads: every read below is kept to the inventoried nodes in Python either way.
        by_cluster = len(names) > _BY_CLUSTER
        node_rows = NodeCapacity.objects.filter(cluster_id=cluster_id, gone_at__isnull=True)
        if not by_cluster:
            node_rows = node_rows.filter(name__in=names)
        nodes = {name: pk for name, pk in node_rows.values_list("name", "id") if name in names}
        inventories = [inv for inv in inventories if inv.node_name in nodes]
        if not inventories:
            return result
        result.nodes = len(inventories)
        node_ids = [nodes[inv.node_name] for inv in inventories]

        gpu_ids, lost_gpu_ids = _reconcile_gpus(cluster_id, inventories, nodes, node_ids, by_cluster, now, result)
        _reconcile_migs(cluster_id, inventories, node_ids, gpu_ids, lost_gpu_ids, by_cluster, now, result)
        fallback = [nodes[inv.node_name] for inv in inventories if inv.node_name not in attributed_by_kubelet]
        if fallback:
            resolve_workloads(cluster_id, inventories, fallback, result)
    return result


def _reconcile_gpus(cluster_id, inventories, nodes, node_ids, by_cluster, now, result):
    """Upsert reported GPUs, mark lost/vanished ones; returns ({uuid: pk} of present GPUs, lost pks).

    Only the inventoried nodes' rows are read, whichever way SQL reads them: a node's report cannot lose, keep or
    take the health of a GPU recorded on a node it does not report (a GPU that moved here is upserted by UUID)."""
    rows = (
        GpuCapacity.objects.filter(node__cluster_id=cluster_id)
        if by_cluster
        else GpuCapacity.objects.filter(node_id__in=node_ids)
    )
    inventoried = set(node_ids)
    by_uuid: dict[str, tuple] = {}
    present_at: dict[tuple[int, int], tuple] = {}
    for row in [r for r in rows.values_list("id", "uuid", "lost_at", *GPU_FIELDS) if r[3] in inventoried]:
        by_uuid[row[1]] = row
        if row[2] is None:
            present_at[(row[3], row[4])] = row

    lost: set[int] = set()
    upserts: list[GpuCapacity] = []
    reported: dict[int, set[str]] = defaultdict(set)
    for inv in inventories:
        node_id = nodes[inv.node_name]
        for gpu in inv.gpus:
            result.gpus += 1
            if gpu.unread:  # keep what the database knows; a partial read must not overwrite or lose it
                row = by_uuid.get(gpu.uuid) if gpu.uuid else present_at.get((node_id, gpu.index))
                if row is not None and row[2] is None:
                    reported[node_id].add(row[1])
                continue
            if gpu.lost:  # not reported: the pass below loses its row, only on the node that holds it
                continue
            reported[node_id].add(gpu.uuid)
            row = by_uuid.get(gpu.uuid)
            occupant = present_at.get((node_id, gpu.index))
            if occupant is not None and occupant[1] != gpu.uuid:
                lost.add(occupant[0])  # another GPU now sits at this index: the old one left
            health = GpuHealth.OK if row is None or row[10] in _STARTS_HEALTHY else row[10]
            catalog = find_product(gpu.name)
            wanted = (
                node_id,
                gpu.index,
                gpu.name[:100],
                catalog.key if catalog else "",
                gpu.memory_mib or 0,
                gpu.mig_current,
                gpu.mig_pending,
                health,
                inv.driver_version[:32],
                inv.cuda_version[:16],
                (gpu.serial or "")[:32],
                (gpu.pci_bus_id or "")[:32],
                gpu.nvlink_group,
                gpu.pcie_group,
                gpu.numa_group,
            )
            if row is not None and row[2] is None and row[3:] == wanted:
                continue
            upserts.append(
                {"uuid": gpu.uuid, **dict(zip(GPU_FIELDS, wanted, strict=True)), "last_seen_at": now, "lost_at": None}
            )
    for (node_id, _), row in present_at.items():
        if row[1] not in reported[node_id]:
            lost.add(row[0])  # no longer enumerated by NVML: vanished

    if lost:
        # Before the upserts: a GPU that moved to another index is restored by its own upsert below.
        GpuCapacity.objects.filter(pk__in=lost, lost_at__isnull=True).update(health=GpuHealth.LOST, lost_at=now)
        still_here = {by_uuid[u][0] for uuids in reported.values() for u in uuids if u in by_uuid}
        result.gpus_lost = len(lost - still_here)
    gpu_ids = {u: by_uuid[u][0] for uuids in reported.values() for u in uuids if u in by_uuid}
    if upserts:
        gpu_ids.update(bulk.upsert(GpuCapacity, upserts, unique=["uuid"], update=_GPU_UPDATE, key="uuid"))
        result.gpus_written = len(upserts)
    return gpu_ids, lost


def _reconcile_migs(cluster_id, inventories, node_ids, gpu_ids, lost_gpu_ids, by_cluster, now, result):
    """Upsert reported MIG instances (one per GPU instance), mark the rest of these nodes' instances gone."""
    rows = MigInstance.objects.filter(state=MigInstanceState.ACTIVE)
    rows = rows.filter(gpu__node__cluster_id=cluster_id) if by_cluster else rows.filter(gpu__node_id__in=node_ids)
    inventoried = set(node_ids)
    active: dict[str, tuple] = {}
    active_at: dict[tuple[int, int], tuple] = {}
    for row in rows.values_list("id", "uuid", "gpu__node_id", *MIG_FIELDS):
        if row[2] in inventoried:
            active[row[1]] = row
            active_at[(row[3], row[6])] = row

    wanted_rows: list[tuple[str, tuple]] = []
    kept: set[str] = set()  # instances NVML could not fully read: left as they are
    unread_gpus = {gpu_ids.get(gpu.uuid) for inv in inventories for gpu in inv.gpus if gpu.unread}
    kept.update(uuid for uuid, row in active.items() if row[3] in unread_gpus)
    needs_catalog = any(gpu.mig_devices for inv in inventories for gpu in inv.gpus)
    profiles, placements = _catalog() if needs_catalog else ({}, {})
    for inv in inventories:
        for gpu in inv.gpus:
            gpu_pk = gpu_ids.get(gpu.uuid) if gpu.uuid and not gpu.lost else None
            if gpu_pk is None or not gpu.mig_current:
                continue
            catalog = find_product(gpu.name)
            seen_gi: set[int] = set()
            for dev in sorted(gpu.mig_devices, key=lambda d: (d.gpu_instance_id, d.compute_instance_id)):
                if dev.gpu_instance_id in seen_gi:
                    continue  # one MigInstance per GPU instance: its first compute instance
                seen_gi.add(dev.gpu_instance_id)
                if dev.placement_start is None and dev.uuid in active:
                    kept.add(dev.uuid)  # placement unreadable (unprivileged agent): keep the recorded one
                    continue
                profile = profiles.get((catalog.key if catalog else "", dev.profile_id))
                placement = placements.get((profile, dev.placement_start)) if profile else None
                if placement is None or placement[1] != dev.placement_size:
                    logger.warning(
                        "%s GPU %s: MIG device %s (profile %s at %s:%s) is not in the catalog; not recorded",
                        inv.node_name,
                        gpu.index,
                        dev.uuid,
                        dev.profile_id,
                        dev.placement_start,
                        dev.placement_size,
                    )
                    continue
                result.mig_instances += 1
                wanted_rows.append(
                    (
                        dev.uuid,
                        (
                            gpu_pk,
                            profile,
                            placement[0],
                            dev.placement_start,
                            dev.placement_size,
                            dev.gpu_instance_id,
                            dev.compute_instance_id,
                        ),
                    )
                )

    reported = {uuid for uuid, _ in wanted_rows} | kept
    gone = {row[0] for uuid, row in active.items() if uuid not in reported}
    upserts = []
    for uuid, wanted in wanted_rows:
        row = active.get(uuid)
        occupant = active_at.get((wanted[0], wanted[3]))
        if occupant is not None and occupant[1] != uuid:
            gone.add(occupant[0])
        if row is not None and row[3:] == wanted:
            continue
        upserts.append(
            {
                "uuid": uuid,
                **dict(zip(MIG_FIELDS, wanted, strict=True)),
                "state": MigInstanceState.ACTIVE,
                "first_seen_at": now,
                "last_seen_at": now,
                "gone_at": None,
            }
        )
    if gone:
        result.mig_gone = MigInstance.objects.filter(pk__in=gone, state=MigInstanceState.ACTIVE).update(
            state=MigInstanceState.GONE, gone_at=now
        )
    if upserts:
        bulk.upsert(MigInstance, upserts, unique=["uuid"], update=_MIG_UPDATE)
        result.mig_written = len(upserts)
    if gone:  # after the upserts: a replacement instance exists by now, the allocation can move to it
        signals.instances_gone.send(sender=MigInstance, instance_ids=sorted(set(gone)), at=now)


def _catalog() -> tuple[dict[tuple[str, int], int], dict[tuple[int, int], tuple[int, int]]]:
    """(product, NVML profile id) -> MigProfile pk; (MigProfile pk, start) -> (MigPlacement pk, size)."""
    profiles = {
        (product, pid): pk for pk, product, pid in MigProfile.objects.values_list("id", "product", "profile_id")
    }
    placements = {
        (profile, start): (pk, size)
        for pk, profile, start, size in MigPlacement.objects.values_list("id", "profile_id", "start", "size")
    }
    return profiles, placements
