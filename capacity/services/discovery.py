"""Discovery: mirror one cluster's GPU nodes, what they offer and what runs on them.

`discover_cluster(cluster_id)` lists the cluster's nodes and pods (capacity.adapters.kubernetes),
then, in one transaction under the cluster's row lock, writes what changed:

- NodeCapacity from labels and status: GPU product/count/memory (GFD labels), tier
  (`gpuaas.io/tier`), node group (`gpuaas.io/node-group`), MIG strategy/config/config state,
  time-slicing replicas, Ready, cordon (spec.unschedulable), labels, capacity, allocatable.
  A node no longer listed is marked gone (gone_at), never deleted; a node listed again is back.
- SpecAndCount, one row per (node, nvidia.com/* extended resource) from capacity/allocatable:
  full GPUs, MIG profiles (mixed `nvidia.com/mig-<profile>` or single-strategy `nvidia.com/gpu`
  with a `-MIG-<profile>` product), time-slice replicas (`.shared` or replicas > 1).
- WorkloadProfile for pods requesting nvidia.com/* resources, or holding ResourceClaims allocated
  devices of NVIDIA's DRA driver (capacity.services.workloads).
- DRA (docs/dra.md): when the cluster serves resource.k8s.io/v1 and the driver `gpu.nvidia.com`
  publishes ResourceSlices, each node's devices (device name -> GPU or MIG UUID, the same UUIDs NVML
  gives GpuCapacity and MigInstance) go to NodeCapacity.dra_devices and the cluster's binding is DRA.

GPU nodes are nodes labelled `nvidia.com/gpu.present=true` (the GPU Operator), or carrying a
`nvidia.com/gpu.count` label (GFD without the operator), or advertising any nvidia.com/*
resource. All nodes are listed and filtered here, because a label selector cannot express that
"or", and a node that stops being a GPU node must be seen to be marked gone.

Cost: existing rows are loaded with one query per table and diffed in Python; only changed rows
are written (INSERT ... ON CONFLICT DO UPDATE upserts); a resync that changes nothing runs the
same handful of queries whatever the number of nodes. Labels that change on every GFD pass
(`nvidia.com/gfd.timestamp`) are not stored, so they do not make every node look changed.

Faults: any failed list (after the adapter's retries) fails the run before anything is written,
so a failed or partial list never marks a node gone. Concurrent or repeated runs are safe: the
write phase takes the cluster row lock and re-reads the rows under it, upserts ride on the
unique constraints, and a run whose list is older than the last applied one writes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from capacity import signals
from capacity.adapters import kubernetes as kube
from capacity.choices import Binding, ClusterStatus, DiscoveryStatus, SpecKind
from capacity.models import Cluster, DiscoveryRun, MigProfile, NodeCapacity, SpecAndCount

from . import bulk, workloads
from .inventory import InventoryResult, inventory_nodes
from .node_labels import (
    FINGERPRINT_VERSION,
    NODE_FIELDS,
    SPEC_FIELDS,
    fingerprint,
    is_gpu_node,
    node_specs,
    node_values,
)
from .tiers import assigned_tiers

logger = logging.getLogger(__name__)

INVENTORY_ENQUEUE = "enqueue"
INVENTORY_INLINE = "inline"
INVENTORY_NONE = "none"
INVENTORY_MODES = (INVENTORY_ENQUEUE, INVENTORY_INLINE, INVENTORY_NONE)

# --- The run ---------------------------------------------------------------------------------


DRA_DRIVER = "gpu.nvidia.com"


@dataclass
class DraView:
    """What the DRA API says: the NVIDIA driver's devices by (pool, name) and the claims by (namespace, name)."""

    devices: dict[tuple[str, str], kube.DraDevice] = field(default_factory=dict)
    claims: dict[tuple[str, str], kube.ResourceClaim] = field(default_factory=dict)

    @classmethod
    def read(cls, client: kube.KubernetesClient) -> DraView | None:
        """None when the cluster does not serve resource.k8s.io/v1 or no slice of the driver exists."""
        try:
            devices = client.list_dra_devices(DRA_DRIVER)
            if not devices:
                return None
            claims = client.list_resource_claims()
        except kube.NotFound:
            return None
        return cls(
            devices={(d.pool, d.name): d for d in devices},
            claims={(c.namespace, c.name): c for c in claims},
        )

    def node_devices(self) -> dict[str, dict[str, str]]:
        """node name -> {device name: uuid}."""
        by_node: dict[str, dict[str, str]] = {}
        for device in self.devices.values():
            by_node.setdefault(device.node_name, {})[device.name] = device.uuid
        return by_node


@dataclass
class SyncResult:
    nodes_seen: int = 0
    gpus_seen: int = 0
    nodes_created: int = 0
    nodes_updated: int = 0
    nodes_gone: int = 0
    specs_written: int = 0
    specs_deleted: int = 0
    workloads: workloads.WorkloadResult = field(default_factory=workloads.WorkloadResult)
    not_ready: int = 0
    nodes_back: int = 0  # listed again, Ready again or uncordoned
    superseded: bool = False
    inventory_nodes: list[str] = field(default_factory=list)


@dataclass
class Discovery:
    """What one discover_cluster() call did: the stored run, and details that are not stored."""

    run: DiscoveryRun
    sync: SyncResult | None = None
    inventory: InventoryResult | None = None  # when the inventory ran inline


def discover_cluster(
    cluster_id: int,
    *,
    inventory: str = INVENTORY_ENQUEUE,
    task_id: str = "",
    client: kube.KubernetesClient | None = None,
) -> Discovery:
    """List one cluster and mirror it; returns the DiscoveryRun row (succeeded or failed) and details.

    inventory: "enqueue" sends inventory_node_task to the node queue of every new or changed
    node after commit; "inline" reads every present node's NVML from this process right after
    (simulator, benchmark; refused with the real local pynvml); "none" skips it.

    Kubernetes failures are recorded on the run and the cluster (status error, last_error) and
    leave every mirrored row as it was. Locking: the cluster row (FOR NO KEY UPDATE) for the
    write phase only; the lists run outside any transaction. Idempotent.
    """
    if inventory not in INVENTORY_MODES:
        raise ValueError(f"inventory must be one of {', '.join(INVENTORY_MODES)}")
    if inventory == INVENTORY_INLINE and _local_nvml():
        raise ValueError("inline inventory with the local pynvml would read this host's GPUs for every node")
    cluster = Cluster.objects.get(pk=cluster_id)
    run = DiscoveryRun.objects.create(cluster=cluster, task_id=task_id or "")
    listed_at = timezone.now()
    try:
        owned = client is None
        kube_client = client or kube.KubernetesClient.for_cluster(cluster)
        try:
            nodes = [node for node in kube_client.list_nodes() if is_gpu_node(node)]
            pods = kube_client.list_pods()
            dra = DraView.read(kube_client)
            api_url = kube_client.host
        finally:
            if owned:
                kube_client.close()
    except kube.KubernetesError as exc:
        _record_failure(run, cluster, listed_at, f"{type(exc).__name__}: {exc}")
        return Discovery(run)

    try:
        result = sync_cluster(cluster.pk, nodes, pods, listed_at=listed_at, dra=dra)
    except Exception as exc:
        _record_failure(run, cluster, listed_at, f"{type(exc).__name__}: {exc}")
        raise

    run.status = DiscoveryStatus.SUCCEEDED
    run.finished_at = timezone.now()
    run.nodes_seen, run.gpus_seen, run.nodes_gone = result.nodes_seen, result.gpus_seen, result.nodes_gone
    run.save(update_fields=["status", "finished_at", "nodes_seen", "gpus_seen", "nodes_gone"])
    outcome = Discovery(run, result)
    if result.superseded:
        logger.info("%s: a newer discovery run was applied first; this one wrote nothing", cluster.name)
    elif inventory == INVENTORY_ENQUEUE and result.inventory_nodes:
        _enqueue_inventory(cluster, result.inventory_nodes)
    elif inventory == INVENTORY_INLINE:
        names = list(NodeCapacity.objects.for_cluster(cluster).present().values_list("name", flat=True))
        outcome.inventory = inventory_nodes(cluster.pk, names, api_url=api_url)
    return outcome


def _record_failure(run: DiscoveryRun, cluster: Cluster, at: datetime, error: str) -> None:
    logger.warning("discovery of %s failed: %s", cluster.name, error)
    DiscoveryRun.objects.filter(pk=run.pk).update(
        status=DiscoveryStatus.FAILED, finished_at=timezone.now(), error=error
    )
    Cluster.objects.filter(pk=cluster.pk).update(status=ClusterStatus.ERROR, last_discovery_at=at, last_error=error)
    run.refresh_from_db()


def _enqueue_inventory(cluster: Cluster, names: list[str]) -> None:
    from capacity.tasks import enqueue_inventory  # cycle: capacity.tasks imports this module

    transaction.on_commit(lambda: enqueue_inventory(cluster.pk, cluster.name, names))


def sync_cluster(
    cluster_id: int, nodes: list[kube.Node], pods: list[kube.Pod], *, listed_at: datetime, dra: DraView | None = None
) -> SyncResult:
    """Write the diff between the listed GPU nodes/pods (and DRA devices) and the mirrored rows (one transaction).

    `nodes` must be the complete list of the cluster's GPU nodes: every present row not in it is
    marked gone. Locks the cluster row first; skips everything (superseded) when a run that
    listed later has already been applied.
    """
    result = SyncResult()
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster_id)
        if cluster.last_success_at and cluster.last_success_at > listed_at:
            result.superseded = True
            return result
        now = timezone.now()
        node_ids = _sync_nodes(cluster, nodes, now, result)
        _sync_dra_devices(cluster, dra)
        result.workloads = workloads.sync_workloads(cluster, pods, node_ids, now, dra=dra)
        # A pod the kubelet has not told us the devices of yet: its node's agent reads PodResources next.
        attribute = sorted(result.workloads.nodes_to_attribute.intersection(node_ids) - set(result.inventory_nodes))
        result.inventory_nodes = [*result.inventory_nodes, *attribute]
        status = ClusterStatus.DEGRADED if result.not_ready else ClusterStatus.OK
        Cluster.objects.filter(pk=cluster.pk).update(
            status=status,
            last_discovery_at=listed_at,
            last_success_at=listed_at,
            last_error="",
            binding=Binding.DRA if dra is not None else Binding.DEVICE_PLUGIN,
        )
    return result


def _sync_nodes(cluster: Cluster, nodes: list[kube.Node], now: datetime, result: SyncResult) -> dict[str, int]:
    """Upsert changed nodes and their specs, mark unlisted ones gone; returns name -> id of all rows.

    A node is unchanged when its resourceVersion is the one stored with the row (the API server
    changes it on every write), or else when its fingerprint (hash of what discovery reads from it:
    GFD rewrites a timestamp label every minute) equals the stored one. Then nothing about it is
    written, and its specs cannot have changed either.
    """
    existing = {
        row[1]: row
        for row in NodeCapacity.objects.filter(cluster=cluster).values_list(
            "id", "name", "gone_at", "fingerprint", "gpu_count", "ready", "resource_version", "cordoned"
        )
    }
    ids = {name: row[0] for name, row in existing.items()}
    assigned: dict[str, str] | None = None  # gpuaas owns these nodes' tiers; read once, when a node changed
    current = FINGERPRINT_VERSION + ":"
    changed: list[tuple[kube.Node, dict, str]] = []
    for node in nodes:
        result.nodes_seen += 1
        row = existing.get(node.name)
        if row is not None and row[2] is None and row[3].startswith(current):
            if row[6] == node.resource_version and node.resource_version:
                digest = row[3]
            else:
                digest = fingerprint(node)
            if row[3] == digest:
                result.gpus_seen += row[4]
                result.not_ready += not row[5]
                continue
        else:
            digest = fingerprint(node)
        values = node_values(node)
        if assigned is None:
            assigned = assigned_tiers(cluster)
        if node.name in assigned:
            values["tier"] = assigned[node.name]
        result.gpus_seen += values["gpu_count"]
        result.not_ready += not values["ready"]
        changed.append((node, values, digest))
        if row is None:
            result.nodes_created += 1
        else:
            result.nodes_updated += 1
            back = row[2] is not None or (values["ready"] and not row[5]) or (row[7] and not values["cordoned"])
            result.nodes_back += back

    listed = {node.name for node in nodes}
    gone_ids = [row[0] for name, row in existing.items() if row[2] is None and name not in listed]
    if gone_ids:
        result.nodes_gone = NodeCapacity.objects.filter(pk__in=gone_ids, gone_at__isnull=True).update(gone_at=now)

    if changed:
        rows = [
            {
                "cluster_id": cluster.pk,
                "name": node.name,
                "resource_version": node.resource_version[:64],
                "fingerprint": digest,
                "first_seen_at": now,
                "last_seen_at": now,
                "gone_at": None,
                "dra_devices": {},  # new rows only (not in the update list): _sync_dra_devices owns it
                **values,
            }
            for node, values, digest in changed
        ]
        ids.update(
            bulk.upsert(
                NodeCapacity,
                rows,
                unique=["cluster_id", "name"],
                update=[*NODE_FIELDS, "resource_version", "fingerprint", "last_seen_at", "gone_at"],
                key="name",
            )
        )
        _sync_specs(cluster, [(ids[node.name], node, values) for node, values, _ in changed], existing, now, result)
        result.inventory_nodes = [node.name for node, _, _ in changed]
    if result.nodes_back:
        signals.capacity_appeared.send(
            sender=NodeCapacity
        )  # units there may be free again: the queue gets a pass after commit
    return ids


def _sync_specs(cluster: Cluster, changed: list[tuple[int, kube.Node, dict]], existing_nodes, now, result) -> None:
    """Rewrite the specs of changed nodes: upsert new/different ones, delete the ones no longer offered."""
    current: dict[tuple[int, str], tuple] = {}
    if any(node.name in existing_nodes for _, node, _ in changed):
        for row in SpecAndCount.objects.filter(node__cluster=cluster).values_list(
            "id", "node_id", "resource_name", *SPEC_FIELDS
        ):
            current[(row[1], row[2])] = row
    profiles: dict[tuple[str, str], int] | None = None
    upserts: list[dict] = []
    keep: set[tuple[int, str]] = set()
    for node_id, node, values in changed:
        for spec in node_specs(node, values):
            profile_id = None
            if spec.kind == SpecKind.MIG:
                if profiles is None:
                    profiles = {(p, n): pk for pk, p, n in MigProfile.objects.values_list("id", "product", "name")}
                profile_id = profiles.get((spec.product, spec.profile_name))
                if profile_id is None:
                    continue
            key = (node_id, spec.resource_name)
            keep.add(key)
            wanted = {
                "kind": spec.kind,
                "product": spec.product,
                "profile_id": profile_id,
                "profile_name": spec.profile_name,
                "count": spec.count,
                "allocatable": spec.allocatable,
                "replicas": spec.replicas,
            }
            row = current.get(key)
            if row is not None and row[3:] == tuple(wanted[f] for f in SPEC_FIELDS):
                continue
            upserts.append({"node_id": node_id, "resource_name": spec.resource_name, **wanted, "updated_at": now})
    changed_ids = {node_id for node_id, _, _ in changed}
    stale = [row[0] for key, row in current.items() if key[0] in changed_ids and key not in keep]
    if stale:
        result.specs_deleted = SpecAndCount.objects.filter(pk__in=stale).delete()[0]
    if upserts:
        bulk.upsert(
            SpecAndCount,
            upserts,
            unique=["node_id", "resource_name"],
            update=[*SPEC_FIELDS, "updated_at"],
        )
        result.specs_written = len(upserts)


def _sync_dra_devices(cluster: Cluster, dra: DraView | None) -> None:
    """Store each node's DRA devices (name -> uuid) where they changed; one read, one bulk update (none at all
    on a cluster that neither is nor was under DRA)."""
    if dra is None and cluster.binding != Binding.DRA:
        return
    wanted = dra.node_devices() if dra is not None else {}
    changed = [
        NodeCapacity(pk=pk, dra_devices=wanted.get(name, {}))
        for pk, name, have in NodeCapacity.objects.filter(cluster=cluster).values_list("id", "name", "dra_devices")
        if have != wanted.get(name, {})
    ]
    if changed:
        NodeCapacity.objects.bulk_update(changed, ["dra_devices"], batch_size=500)


def _local_nvml() -> bool:
    return settings.NVML_LIBRARY.endswith(".local_pynvml")


def inventory_mode_default() -> str:
    """inline under a per-node NVML factory (the simulator), enqueue with the real local pynvml."""
    return INVENTORY_ENQUEUE if _local_nvml() else INVENTORY_INLINE
