"""The shared-fleet world of two benchmarks (dedication, podresources_fleet): a cluster's units dealt to projects
as reservations, and the pods those projects create and delete on them through the simulator's API."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from capacity.models import Cluster, GpuCapacity, MigInstance
from pools.models import Allocation, GpuPool, PoolRequest
from simcluster.kube import ClusterApi
from simcluster.scheduler import assigned_devices
from tenancy.models import Project

GPU_RESOURCE = "nvidia.com/gpu"


def units_by_node(cluster: Cluster) -> dict[str, list[tuple[GpuCapacity, MigInstance | None]]]:
    """Each node's units in order: its active MIG instances, then its whole (MIG off) GPUs."""
    units: dict[str, list[tuple[GpuCapacity, MigInstance | None]]] = {}
    migs = MigInstance.objects.active().filter(gpu__node__cluster=cluster).select_related("gpu__node", "profile")
    for instance in migs.order_by("gpu__node__name", "gpu__index", "placement_start"):
        units.setdefault(instance.gpu.node.name, []).append((instance.gpu, instance))
    gpus = GpuCapacity.objects.filter(node__cluster=cluster, mig_mode_current=False).select_related("node")
    for gpu in gpus.order_by("node__name", "index"):
        units.setdefault(gpu.node.name, []).append((gpu, None))
    return units


def deal(
    cluster: Cluster,
    holders_for: Callable[[], list[Project]],
    holder: Callable[[int, list[Project]], Project],
    *,
    product: Callable[[GpuCapacity], str],
    pool_prefix: str = "",
) -> dict[str, dict[int, list[tuple[str, str]]]]:
    """Deal every node's units but its last (left unallocated): `holders_for()` picks the node's holders (nodes in
    name order), `holder(i, holders)` the one that takes unit i, as an Allocation in its pool of that kind (made
    on first need). Returns {node name: {project id: [(resource, device uuid) held]}}."""
    pools: dict[tuple[int, str], GpuPool] = {}
    rows, held = [], {}
    for node_name, node_units in sorted(units_by_node(cluster).items()):
        holders = holders_for()
        held[node_name] = {p.pk: [] for p in holders}
        for i, (gpu, instance) in enumerate(node_units[:-1]):
            project = holder(i, holders)
            kind = "mig" if instance else "full"
            if (project.pk, kind) not in pools:
                request = PoolRequest.objects.create(project=project, product=product(gpu), state="active", count=1)
                pools[(project.pk, kind)] = GpuPool.objects.create(
                    project=project,
                    request=request,
                    cluster=cluster,
                    name=f"{pool_prefix}{kind}-{project.slug}",
                    workload_type="inference",
                    state="active",
                )
            resource = instance.profile.resource_name if instance else GPU_RESOURCE
            rows.append(
                Allocation(
                    pool=pools[(project.pk, kind)],
                    project=project,
                    kind=kind,
                    gpu=gpu,
                    mig_instance=instance,
                    resource_name=resource,
                    product=product(gpu),
                    profile_name=instance.profile.name if instance else "",
                    compute_slices=instance.profile.compute_slices if instance else 7,
                )
            )
            held[node_name][project.pk].append((resource, instance.uuid if instance else gpu.uuid))
    Allocation.objects.bulk_create(rows, batch_size=2000)
    return held


class PodChurn:
    """Pods through the simulator's API, as projects would create and delete them (named `prefix`1, 2, ...)."""

    def __init__(self, state, cluster: str, projects: list[Project], *, prefix: str):
        self.state = state
        self.cluster = state.cluster(cluster)
        self.api = ClusterApi(self.cluster)
        self.names = (f"{prefix}{n}" for n in itertools.count(1))
        self.pods: list[tuple[str, str]] = []
        with state.lock:
            for project in projects:
                self.api.create("namespaces", None, {"metadata": {"name": project.namespace}})

    def run(self, namespace: str, node: str, resource: str, count: int = 1) -> None:
        name = next(self.names)
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "main", "image": "x", "resources": {"limits": {resource: str(count)}}}],
            },
        }
        with self.state.lock:
            self.api.create("pods", namespace, body)
        self.pods.append((namespace, name))

    def delete(self, namespace: str, name: str) -> None:
        with self.state.lock:
            self.api.delete("pods", namespace, name, 0)
        self.pods.remove((namespace, name))

    def bound(self) -> list[tuple[str, str, str, list[str]]]:
        """(namespace, name, uid, device ids) of every running pod the device plugin gave devices (the device ids
        are what the kubelet's PodResources lists)."""
        with self.state.lock:
            out = []
            for (namespace, name), record in self.cluster.pods.items():
                meta, status = record.obj["metadata"], record.obj.get("status") or {}
                ids = assigned_devices(self.cluster, namespace, name)
                if ids and status.get("phase") == "Running":
                    out.append((namespace, name, meta.get("uid", ""), ids))
            return out
