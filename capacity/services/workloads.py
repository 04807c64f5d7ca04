"""Workload tracking, the seed's "Profile": which pod runs on which GPU or MIG instance.

Every pod that requests an nvidia.com/* resource becomes one WorkloadProfile row per resource (a KubeVirt
VirtualMachineInstance too: its virt-launcher pod requests the VM's vGPU, `nvidia.com/NVIDIA_<type>`, and the
row names the VMI in `vmi_name`, from the pod's kubevirt.io/domain annotation):
node, resource, count, project (the tenancy.Project whose namespace the pod runs in, kept current
on every discovery: a pod found before its namespace became a project's is attributed the next
time), and the devices it was given. Under the device plugin the devices come from the kubelet's
PodResources API, which the node agent reads with each inventory (`capacity.adapters.podresources`;
`capacity.services.inventory` writes them, matching the pod by node, namespace and name), else from the
node agent's NVML process list; discovery creates such a row without devices and names its node for an
inventory read (`WorkloadResult.nodes_to_attribute`). A row ends (ended_at) when its pod finishes or
disappears; it is never reopened or deleted.

Under DRA (docs/dra.md) a pod requests no extended resource: its devices are the allocation results
(driver, pool, device) of the ResourceClaims it holds (`status.allocation.devices.results`), named by the
driver's ResourceSlices with their UUIDs. They become rows like the device plugin's, under the resource
name the device plugin would give that device (`nvidia.com/gpu`, `nvidia.com/mig-<profile>`), so use
and cards read both worlds alike.

Called by discovery inside its transaction (cluster row locked). Queries per call do not grow
with the number of pods: running rows are loaded once, devices and projects resolved in one
query each when needed, writes are one upsert and one UPDATE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import Q

from capacity.adapters import kubernetes as kube
from capacity.models import Cluster, GpuCapacity, MigInstance, WorkloadProfile
from tenancy.models import Project

from . import bulk

if TYPE_CHECKING:
    from .discovery import DraView

RESOURCE_PREFIX = "nvidia.com/"
_UPDATE_FIELDS = [
    "namespace",
    "pod_name",
    "vmi_name",
    "node_id",
    "gpu_id",
    "mig_instance_id",
    "device_ids",
    "count",
    "project_id",
]


@dataclass
class WorkloadResult:
    created: int = 0
    updated: int = 0
    ended: int = 0
    # Nodes with a running device-plugin pod whose devices are not known yet: their kubelet is asked next.
    nodes_to_attribute: set[str] = field(default_factory=set)


def physical_id(device_id: str) -> str:
    """A time-slice replica id "<uuid>::<n>" names the device <uuid>."""
    return device_id.split("::", 1)[0]


def _started(pod: kube.Pod, now: datetime) -> datetime:
    if pod.start_time:
        try:
            return datetime.fromisoformat(pod.start_time.replace("Z", "+00:00"))
        except ValueError:
            pass
    return now


class DeviceResolver:
    """Device UUID -> (gpu id, MIG instance id), two queries for a whole batch."""

    def __init__(self, ids: set[str]):
        uuids = {physical_id(i) for i in ids}
        gpu_uuids = [u for u in uuids if not u.startswith("MIG-")]
        mig_uuids = [u for u in uuids if u.startswith("MIG-")]
        self.gpus = dict(GpuCapacity.objects.filter(uuid__in=gpu_uuids).values_list("uuid", "id")) if gpu_uuids else {}
        self.migs = (
            {
                u: (gpu, pk)
                for pk, u, gpu in MigInstance.objects.filter(uuid__in=mig_uuids).values_list("id", "uuid", "gpu_id")
            }
            if mig_uuids
            else {}
        )

    def resolve(self, ids: list[str]) -> tuple[int | None, int | None]:
        for device_id in ids:
            uuid = physical_id(device_id)
            if uuid in self.migs:
                return self.migs[uuid]
            if uuid in self.gpus:
                return self.gpus[uuid], None
        return None, None


def dra_resource_name(device: kube.DraDevice) -> str:
    """The extended resource the device plugin would advertise the device under."""
    if device.type == "mig" and device.profile:
        return f"nvidia.com/mig-{device.profile.replace('+', '.')}"
    return "nvidia.com/gpu"


def claimed_devices(pod: kube.Pod, dra: DraView) -> dict[str, list[str]]:
    """resource name -> device UUIDs allocated to the claims the pod holds (reserves)."""
    found: dict[str, list[str]] = {}
    for name in pod.claims:
        claim = dra.claims.get((pod.namespace, name))
        if claim is None or (claim.reserved_for and pod.uid not in claim.reserved_for):
            continue
        for _, driver, pool, device_name in claim.results:
            device = dra.devices.get((pool, device_name))
            if device is not None and device.driver == driver:
                found.setdefault(dra_resource_name(device), []).append(device.uuid)
    return found


def sync_workloads(
    cluster: Cluster, pods: list[kube.Pod], node_ids: dict[str, int], now: datetime, *, dra: DraView | None = None
) -> WorkloadResult:
    """Mirror the cluster's GPU pods into WorkloadProfile rows; `pods` must be the complete list."""
    result = WorkloadResult()
    # ids None: a device-plugin pod, whose devices only its kubelet knows (kept as the inventory wrote them).
    desired: dict[tuple[str, str], tuple[kube.Pod, int, list[str] | None]] = {}
    for pod in pods:
        gpu_requests = {r: n for r, n in pod.requests.items() if r.startswith(RESOURCE_PREFIX) and n > 0}
        if not gpu_requests and dra is not None and pod.claims and pod.uid:
            for resource, uuids in claimed_devices(pod, dra).items():
                desired[(pod.uid, resource)] = (pod, len(uuids), uuids)
            continue
        if not gpu_requests or not pod.uid:
            continue
        for resource, count in gpu_requests.items():
            desired[(pod.uid, resource)] = (pod, count, None)

    finished = {pod.uid for pod, _, _ in desired.values() if pod.finished}
    scope = Q(ended_at__isnull=True)
    if finished:
        scope |= Q(pod_uid__in=finished)
    existing = {
        (row[1], row[2]): row
        for row in WorkloadProfile.objects.filter(cluster=cluster)
        .filter(scope)
        .values_list(
            "id",
            "pod_uid",
            "resource_name",
            "node_id",
            "gpu_id",
            "mig_instance_id",
            "device_ids",
            "count",
            "ended_at",
            "project_id",
        )
    }

    # Resolve devices only for rows that are new, changed their ids, or are still unresolved.
    to_resolve: set[str] = set()
    for key, (_, _, ids) in desired.items():
        row = existing.get(key)
        if ids and (row is None or (row[8] is None and (row[6] != ids or (row[4] is None and row[5] is None)))):
            to_resolve.update(ids)
    resolver = DeviceResolver(to_resolve) if to_resolve else None
    # Every live pod's namespace, not only new ones: a namespace that became a project's (or moved
    # to another project) since the pod was first seen re-attributes its running rows.
    namespaces = {pod.namespace for pod, _, _ in desired.values()}
    projects = (
        dict(Project.objects.filter(namespace__in=namespaces).values_list("namespace", "id")) if namespaces else {}
    )

    upserts: list[WorkloadProfile] = []
    ended: list[int] = []
    for key, (pod, count, ids) in desired.items():
        row = existing.get(key)
        if row is not None and row[8] is not None:
            continue  # ended rows stay ended
        gpu_id, mig_id = resolver.resolve(ids) if resolver and ids else (None, None)
        node_id = node_ids.get(pod.node_name)
        if ids is None and not pod.finished and pod.node_name and (row is None or not row[6]):
            result.nodes_to_attribute.add(pod.node_name)
        if row is None:
            upserts.append(
                {
                    **_row(cluster, pod, key[1], node_id, gpu_id, mig_id, ids or [], count),
                    "project_id": projects.get(pod.namespace),
                    "started_at": _started(pod, now),
                    "ended_at": now if pod.finished else None,
                }
            )
            result.created += 1
            continue
        if pod.finished:
            ended.append(row[0])
            continue
        # Keep the devices the node agent attributed (PodResources, NVML) when discovery knows nothing newer.
        gpu_id, mig_id = (gpu_id, mig_id) if (gpu_id or mig_id) else (row[4], row[5])
        ids = row[6] if ids is None else ids
        project_id = projects.get(pod.namespace)
        if (row[3], row[4], row[5], row[6], row[7], row[9]) != (node_id, gpu_id, mig_id, ids, count, project_id):
            upserts.append(
                {
                    **_row(cluster, pod, key[1], node_id, gpu_id, mig_id, ids, count),
                    "project_id": project_id,
                    "started_at": _started(pod, now),
                    "ended_at": None,
                }
            )
            result.updated += 1

    ended.extend(row[0] for key, row in existing.items() if row[8] is None and key not in desired)
    if ended:
        result.ended = WorkloadProfile.objects.filter(pk__in=ended, ended_at__isnull=True).update(ended_at=now)
    if upserts:
        bulk.upsert(WorkloadProfile, upserts, unique=["cluster_id", "pod_uid", "resource_name"], update=_UPDATE_FIELDS)
    return result


def _row(cluster, pod: kube.Pod, resource: str, node_id, gpu_id, mig_id, ids: list[str], count: int) -> dict:
    return {
        "cluster_id": cluster.pk,
        "namespace": pod.namespace,
        "pod_name": pod.name,
        "pod_uid": pod.uid,
        "vmi_name": pod.vmi[:253],
        "resource_name": resource,
        "node_id": node_id,
        "gpu_id": gpu_id,
        "mig_instance_id": mig_id,
        "device_ids": ids,
        "count": min(count, 32767),
    }


def attribute_from_exporter(cluster_id: int, labelled: dict[tuple[str, str], list[str]]) -> int:
    """Devices for running workloads that still have none, from dcgm-exporter's pod labels: the second source.

    dcgm-exporter labels a device's metrics with the pod the kubelet's PodResources gave it (NVIDIA/dcgm-exporter,
    internal/pkg/transformation/kubernetes.go), so a scrape names (namespace, pod) -> device UUIDs even where
    gpuaas' own agent could not ask the kubelet. A row that already has devices (PodResources, a DRA claim) is
    left alone. A pod's MIG rows take its MIG UUIDs, its whole-GPU rows its GPU UUIDs. Returns rows written.
    Idempotent; one read and one bulk update. Locking: the cluster row (FOR NO KEY UPDATE, as discovery and the
    inventory), in the caller's transaction.
    """
    Cluster.objects.select_for_update(no_key=True).filter(pk=cluster_id).values_list("pk").get()
    namespaces = sorted({namespace for namespace, _ in labelled})
    rows = [
        row
        for row in WorkloadProfile.objects.filter(
            cluster_id=cluster_id, ended_at__isnull=True, namespace__in=namespaces
        ).values_list("id", "namespace", "pod_name", "resource_name", "device_ids")
        if not row[4] and (row[1], row[2]) in labelled
    ]
    if not rows:
        return 0
    resolver = DeviceResolver({uuid for _, ns, pod, _, _ in rows for uuid in labelled[(ns, pod)]})
    updates = []
    for pk, namespace, pod, resource, _ in rows:
        mig = resource.startswith("nvidia.com/mig-")
        ids = [uuid for uuid in labelled[(namespace, pod)] if uuid.startswith("MIG-") == mig]
        gpu_id, mig_id = resolver.resolve(ids)
        if ids and (gpu_id or mig_id):
            updates.append(WorkloadProfile(pk=pk, device_ids=ids, gpu_id=gpu_id, mig_instance_id=mig_id))
    if updates:
        WorkloadProfile.objects.bulk_update(updates, ["device_ids", "gpu", "mig_instance"], batch_size=500)
    return len(updates)
