"""The kubelet's PodResources API, one unix socket per simulated node (gRPC `v1.PodResourcesLister`).

A real kubelet serves `List`, `GetAllocatableResources` and `Get` on `/var/lib/kubelet/pod-resources/
kubelet.sock` (kubernetes/kubelet v0.36.3, pkg/apis/podresources/v1/api.proto); dcgm-exporter and the
gpuaas node agent read it to learn which pod holds which device. Here every node of every cluster gets
its own socket, `<root>/<digest of the cluster's API URL>/<node>.sock` (the layout gpuaas' DEBUG default
of PODRESOURCES_SOCKET expects), answering from what the simulated kubelet really handed out
(`Node.assigned`, written by `scheduler.bind`): each pod on the node, its containers, and per container the
device ids of each `nvidia.com/*` resource it requested, in the order the devices were allocated.

The per-node knob `Node.pod_resources` plays a real node's failure modes (applied by `sync()`, which the
server's background loop calls):

- "ok": served;
- "missing": no socket (a kubelet before 1.13, or the directory not mounted);
- "denied": the socket exists with mode 000 (an agent without the right uid, or without
  CAP_DAC_OVERRIDE, cannot connect);
- "old-kubelet": `GetAllocatableResources` and `Get` answer UNIMPLEMENTED (kubelets before 1.23), `List`
  works.

The stubs are gpuaas' generated ones (`capacity/adapters/podresources/v1`: generated code, no gpuaas logic).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# grpc core logs a line at INFO for every channel a stopping server closes; only errors are worth a line.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402

from capacity.adapters.podresources.v1 import api_pb2, api_pb2_grpc

from .scheduler import gpu_requests, is_terminal
from .state import Cluster, SimState

DEFAULT_ROOT = Path(tempfile.gettempdir()) / "gpuaas-podres"
MODES = ("ok", "missing", "denied", "old-kubelet")
_UNIMPLEMENTED = "unknown method {} for service v1.PodResourcesLister"


def api_digest(api_url: str) -> str:
    """The directory name of one cluster's sockets (the same digest gpuaas' PODRESOURCES_SOCKET template uses)."""
    return hashlib.sha256(api_url.rstrip("/").encode()).hexdigest()[:12]


def pod_devices(cluster: Cluster, node_name: str) -> list[tuple[dict, list[tuple[str, dict[str, list[str]]]]]]:
    """(pod, [(container name, {resource: device ids})]) for every non-terminal pod bound to the node.

    A pod's devices are split over its containers in container order, by each container's requests
    (limits standing in), as the kubelet's device manager allocates per container.
    """
    node = cluster.nodes[node_name]
    held: dict[tuple[str, str], list[str]] = {}
    for device_id, key in node.assigned.items():  # insertion order: bind() allocates resource by resource
        held.setdefault(key, []).append(device_id)
    result = []
    for key, record in sorted(cluster.pods.items()):
        pod = record.obj
        if pod["spec"].get("nodeName") != node_name or is_terminal(pod):
            continue
        ids = list(held.get(key, ()))
        per_resource: dict[str, list[str]] = {}
        for resource in sorted(gpu_requests(pod)):
            count = gpu_requests(pod)[resource]
            per_resource[resource], ids = ids[:count], ids[count:]
        containers = []
        for container in pod["spec"].get("containers") or []:
            wanted = gpu_requests({"spec": {"containers": [container]}})
            devices = {}
            for resource, count in sorted(wanted.items()):
                mine = per_resource.get(resource, [])
                devices[resource], per_resource[resource] = mine[:count], mine[count:]
            containers.append((container.get("name", ""), {r: d for r, d in devices.items() if d}))
        result.append((pod, containers))
    return result


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    """One node's kubelet PodResources service."""

    def __init__(self, state: SimState, cluster: str, node: str):
        self.state, self.cluster, self.node = state, cluster, node

    def _old(self) -> bool:
        node = self.state.clusters[self.cluster].nodes.get(self.node)
        return node is not None and node.pod_resources == "old-kubelet"

    def _pod(self, pod: dict, containers) -> api_pb2.PodResources:
        return api_pb2.PodResources(
            name=pod["metadata"]["name"],
            namespace=pod["metadata"]["namespace"],
            containers=[
                api_pb2.ContainerResources(
                    name=name,
                    devices=[
                        api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                        for resource, ids in sorted(devices.items())
                    ],
                )
                for name, devices in containers
            ],
        )

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        with self.state.lock:
            cluster = self.state.clusters[self.cluster]
            if self.node not in cluster.nodes:
                return api_pb2.ListPodResourcesResponse()
            pods = [self._pod(pod, containers) for pod, containers in pod_devices(cluster, self.node)]
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    def GetAllocatableResources(self, request, context):  # noqa: N802
        if self._old():
            context.abort(grpc.StatusCode.UNIMPLEMENTED, _UNIMPLEMENTED.format("GetAllocatableResources"))
        with self.state.lock:
            node = self.state.clusters[self.cluster].nodes.get(self.node)
            devices = sorted((node.devices if node else {}).items())
            return api_pb2.AllocatableResourcesResponse(
                devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in devices if ids]
            )

    def Get(self, request, context):  # noqa: N802
        if self._old():
            context.abort(grpc.StatusCode.UNIMPLEMENTED, _UNIMPLEMENTED.format("Get"))
        with self.state.lock:
            cluster = self.state.clusters[self.cluster]
            for pod, containers in pod_devices(cluster, self.node) if self.node in cluster.nodes else ():
                if (pod["metadata"]["namespace"], pod["metadata"]["name"]) == (request.pod_namespace, request.pod_name):
                    return api_pb2.GetPodResourcesResponse(pod_resources=self._pod(pod, containers))
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found in {request.pod_namespace}")


class PodResourcesHost:
    """The sockets of every node of a SimState, served by one small thread pool; `sync()` follows the nodes
    and their `pod_resources` knob."""

    def __init__(self, state: SimState, cluster_urls: dict[str, str], root: Path | str = DEFAULT_ROOT):
        self.state = state
        self.cluster_urls = cluster_urls
        self.root = Path(root)
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="simcluster-podres")
        self._servers: dict[tuple[str, str], tuple[grpc.Server, Path]] = {}
        self._lock = threading.Lock()  # sync() runs on the server's background thread and in tests

    def socket_path(self, cluster: str, node: str) -> Path:
        return self.root / api_digest(self.cluster_urls[cluster]) / f"{node}.sock"

    def sync(self) -> None:
        """Start a socket for every node that lacks one, stop those of vanished nodes, apply the knobs."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        with self.state.lock:
            wanted = {
                (name, node.name): node.pod_resources
                for name, cluster in self.state.clusters.items()
                if name in self.cluster_urls
                for node in cluster.nodes.values()
            }
        for key in [k for k in self._servers if wanted.get(k, "missing") == "missing"]:
            self._stop(key)
        for key, mode in wanted.items():
            if mode == "missing":
                continue
            if key not in self._servers:
                self._start(key)
            path = self._servers[key][1]
            want = 0 if mode == "denied" else 0o660
            if path.exists() and (path.stat().st_mode & 0o777) != want:
                os.chmod(path, want)

    def _start(self, key: tuple[str, str]) -> None:
        path = self.socket_path(*key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a stale socket of an earlier run
        server = grpc.server(self._executor)
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self.state, *key), server)
        server.add_insecure_port(f"unix:{path}")
        server.start()
        self._servers[key] = (server, path)

    def _stop(self, key: tuple[str, str]) -> None:
        server, path = self._servers.pop(key)
        server.stop(None)
        path.unlink(missing_ok=True)

    def stop(self) -> None:
        with self._lock:
            for key in list(self._servers):
                self._stop(key)
            for cluster in self.cluster_urls:  # the per-cluster directories, when nothing else is left in them
                try:
                    self.socket_path(cluster, "x").parent.rmdir()
                except OSError:
                    pass
        self._executor.shutdown(wait=False)
