"""Which running workload holds which device, settled during an inventory pass (capacity.services.inventory).

A device-plugin pod gets the devices its kubelet's PodResources API lists for it (attribute_workloads); a
workload on a node whose kubelet could not be asked gets the device NVML now identifies (resolve_workloads)."""

from __future__ import annotations

from capacity import signals
from capacity.adapters import podresources
from capacity.models import Cluster, NodeCapacity, WorkloadProfile

from .workloads import DeviceResolver


def resolve_workloads(cluster_id, inventories, node_ids, result) -> None:
    """Give running workloads on these nodes (whose kubelet could not be asked) that still lack a device the one
    NVML now identifies: their recorded device ids resolved against the fresh UUIDs, else NVML process -> pod."""
    rows = list(
        WorkloadProfile.objects.filter(
            cluster_id=cluster_id,
            node_id__in=node_ids,
            ended_at__isnull=True,
            gpu__isnull=True,
            mig_instance__isnull=True,
        ).values_list("id", "pod_uid", "device_ids")
    )
    if not rows:
        return
    pods = {pod_uid for _, pod_uid, _ in rows}
    by_pod: dict[str, str] = {}
    for inv in inventories:
        for gpu in inv.gpus:
            for proc in gpu.processes:
                if proc.pod_uid in pods and gpu.uuid:
                    by_pod.setdefault(proc.pod_uid, gpu.uuid)
            for dev in gpu.mig_devices:
                for proc in dev.processes:
                    if proc.pod_uid in pods:
                        by_pod.setdefault(proc.pod_uid, dev.uuid)
    resolver = DeviceResolver({i for _, _, ids in rows for i in ids or ()} | set(by_pod.values()))
    updates = []
    for pk, pod_uid, ids in rows:
        gpu_id, mig_id = resolver.resolve(ids or [])
        if gpu_id is None and mig_id is None and pod_uid in by_pod:
            gpu_id, mig_id = resolver.resolve([by_pod[pod_uid]])
        if gpu_id is not None or mig_id is not None:
            updates.append(WorkloadProfile(pk=pk, gpu_id=gpu_id, mig_instance_id=mig_id))
    if updates:
        WorkloadProfile.objects.bulk_update(updates, ["gpu", "mig_instance"], batch_size=500)
        result.workloads_resolved = len(updates)


def attribute_workloads(cluster_id: int, held: dict[str, podresources.PodResourcesReading], result) -> None:
    """Give each running device-plugin workload on these nodes the devices its kubelet lists for it, all of them.

    A row the kubelet does not list (a DRA pod: its devices come from its claims; a pod not admitted yet) is left
    as it is. `gpu` / `mig_instance` name the first device, `device_ids` every one, so a pod with several GPUs is
    in use on each (`Allocation.objects.in_use()`). Locking: the cluster row (FOR NO KEY UPDATE, as discovery,
    whose workload sync must not write back a row's devices read before this), in the caller's transaction.
    Idempotent: a repeated report writes the same ids.
    """
    Cluster.objects.select_for_update(no_key=True).filter(pk=cluster_id).values_list("pk").get()
    node_ids = dict(
        NodeCapacity.objects.filter(cluster_id=cluster_id, name__in=held, gone_at__isnull=True).values_list(
            "name", "id"
        )
    )
    listed: dict[tuple[int, str, str, str], list[str]] = {}
    for name, reading in held.items():
        if name not in node_ids:
            continue
        for pod in reading.pods:
            for resource, ids in pod.devices.items():
                listed[(node_ids[name], pod.namespace, pod.name, resource)] = list(ids)
    rows = list(
        WorkloadProfile.objects.filter(cluster_id=cluster_id, node_id__in=node_ids.values(), ended_at__isnull=True)
        .values_list(
            "id", "node_id", "namespace", "pod_name", "resource_name", "device_ids", "gpu_id", "mig_instance_id"
        )
        .order_by("pk")
    )
    wanted = [(row, listed[row[1:5]]) for row in rows if row[1:5] in listed]
    if not wanted:
        return
    resolver = DeviceResolver({i for _, ids in wanted for i in ids})
    updates = []
    for (pk, _, _, _, _, have, gpu_id, mig_id), ids in wanted:
        gpu, mig = resolver.resolve(ids)
        if (have, gpu_id, mig_id) != (ids, gpu, mig):
            updates.append(WorkloadProfile(pk=pk, device_ids=ids, gpu_id=gpu, mig_instance_id=mig))
    if updates:
        WorkloadProfile.objects.bulk_update(updates, ["device_ids", "gpu", "mig_instance"], batch_size=500)
        result.workloads_attributed = len(updates)
        signals.workloads_attributed.send(sender=WorkloadProfile, cluster_id=cluster_id, count=len(updates))
