"""The kubelet PodResources adapter: which pod holds which device on this node, as the kubelet allocated it.

The only code in gpuaas that imports grpc. The node agent calls `read_node()` with each inventory; it asks
the kubelet's `v1.PodResourcesLister` (`List`, `GetAllocatableResources`) on the node's
`pod-resources/kubelet.sock` through the stubs in `v1/` (generated from the upstream api.proto, see
README.md) and returns plain dataclasses. Every failure is a value, never an exception, so an inventory is
still read when the kubelet cannot be asked:

- the socket is missing (kubelet older than 1.13 or the directory not mounted): `error` says so;
- the socket refuses this process (not writable for its uid/gid; the shipped agent has no
  CAP_DAC_OVERRIDE, so file modes apply to its root user too): `error` says "permission denied";
- `GetAllocatableResources` unimplemented (kubelets before 1.23, or its feature gate off): `allocatable`
  is None and `warnings` names it; `List` is still used.

Only NVIDIA resources are kept (`nvidia.com/gpu`, `nvidia.com/mig-*` and the renamed/shared
`nvidia.com/*` ones), as dcgm-exporter does (NVIDIA/dcgm-exporter,
internal/pkg/transformation/kubernetes.go `iterateGPUDevices`). Device ids are what the NVIDIA device
plugin announced: GPU UUIDs, MIG UUIDs, and `<uuid>::<n>` for a time-slice replica.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from functools import cache

# grpc core logs a line at INFO for every channel a stopping server closes; only errors are worth a line.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402
from django.conf import settings

from .v1 import api_pb2, api_pb2_grpc

KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
RESOURCE_PREFIX = "nvidia.com/"
ERROR_MISSING = "missing"
ERROR_DENIED = "permission denied"


@dataclass
class PodDevices:
    """The NVIDIA devices the kubelet allocated to one pod, by resource name (all containers together)."""

    namespace: str
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class PodResourcesReading:
    """One read of a node's PodResources: pods with devices; `error` when List could not be read."""

    socket: str
    pods: list[PodDevices] = field(default_factory=list)
    allocatable: dict[str, list[str]] | None = None
    error: str = ""
    warnings: list[str] = field(default_factory=list)


def socket_for(api_url: str, node_name: str) -> str:
    """The socket path of `node_name`: settings.PODRESOURCES_SOCKET with `{api}` (a short digest of the
    cluster's API URL, so two simulated clusters never share a directory) and `{node}` filled in.

    A real node agent reads its own node's kubelet: the default has no placeholder.
    """
    template = settings.PODRESOURCES_SOCKET
    if "{" not in template:
        return template
    return template.format(api=api_digest(api_url), node=node_name)


def api_digest(api_url: str) -> str:
    return hashlib.sha256(api_url.rstrip("/").encode()).hexdigest()[:12]


def _denied(path: str) -> bool:
    """True if this process may not connect to the socket (write permission), by the mode bits alone."""
    st = os.stat(path)
    if os.geteuid() == st.st_uid:
        bits = st.st_mode >> 6
    elif st.st_gid in {os.getegid(), *os.getgroups()}:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return not (bits & stat.S_IWOTH)


def _nvidia(devices) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for device in devices:
        if device.resource_name.startswith(RESOURCE_PREFIX) and device.device_ids:
            found.setdefault(device.resource_name, []).extend(device.device_ids)
    return found


@cache
def _channel(path: str) -> grpc.Channel:
    # One channel per socket per process (a node agent has one); grpc reconnects it when the kubelet restarts.
    return grpc.insecure_channel(f"unix:{path}")


def read_node(
    api_url: str, node_name: str, *, timeout_s: float | None = None, allocatable: bool = True
) -> PodResourcesReading:
    """The node's pods with NVIDIA devices and (unless allocatable=False: `List` only, the metrics poll's read)
    its allocatable NVIDIA devices; failures are values."""
    path = socket_for(api_url, node_name)
    timeout = settings.PODRESOURCES_TIMEOUT_S if timeout_s is None else timeout_s
    reading = PodResourcesReading(socket=path)
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            reading.error = f"{ERROR_MISSING}: {path} is not a socket"
            return reading
        if _denied(path):
            reading.error = f"{ERROR_DENIED}: {path}"
            return reading
    except FileNotFoundError:
        reading.error = f"{ERROR_MISSING}: {path}"
        return reading
    except PermissionError:
        reading.error = f"{ERROR_DENIED}: {path}"
        return reading
    stub = api_pb2_grpc.PodResourcesListerStub(_channel(path))
    try:
        listed = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        reading.error = _rpc_error(exc, path)
        return reading
    for pod in listed.pod_resources:
        devices: dict[str, list[str]] = {}
        for container in pod.containers:
            for resource, ids in _nvidia(container.devices).items():
                devices.setdefault(resource, []).extend(ids)
        if devices:
            reading.pods.append(PodDevices(namespace=pod.namespace, name=pod.name, devices=devices))
    if not allocatable:
        return reading
    try:
        answer = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=timeout)
        reading.allocatable = _nvidia(answer.devices)
    except grpc.RpcError as exc:
        reading.warnings.append(f"GetAllocatableResources: {_rpc_error(exc, path)}")
    return reading


def _rpc_error(exc: grpc.RpcError, path: str) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "unimplemented (kubelet before 1.23, or KubeletPodResourcesGetAllocatable off)"
    if code == grpc.StatusCode.UNAVAILABLE and "ermission denied" in (details or ""):
        return f"{ERROR_DENIED}: {path}"
    return f"{code.name if code else 'error'}: {details}"


def pods_digest(reading: PodResourcesReading) -> str | None:
    """A short fingerprint of which pod holds which NVIDIA devices (None when the kubelet could not be asked):
    the metrics poll sends it, so the control plane learns a node's pod -> device set changed without the set."""
    if reading.error:
        return None
    pairs = sorted(
        (p.namespace, p.name, resource, sorted(ids)) for p in reading.pods for resource, ids in p.devices.items()
    )
    return hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()[:32]
