"""Fault knobs: make the Kubernetes API and the GPUs misbehave on purpose.

Python API: `state.faults.<knob>(...)`; HTTP: `POST /sim/v1/faults` with
`{"fault": "<knob>", ...keyword arguments...}` (the cluster defaults to the one in the URL).
`reset()` undoes everything: API faults cleared, vanished nodes back, GPUs healthy,
error counters zeroed, throttling off.

API faults count requests as the server receives them. Note that urllib3 (under the
official client) retries idempotent requests on read timeouts, so one client call that
times out can consume several "timeout" faults.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import Cluster, SimState

# nvml.h event types
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8

XID_FALLEN_OFF_BUS = 79


@dataclass
class ApiFault:
    kind: str  # error | timeout | page
    remaining: int
    status: int = 500
    path_prefix: str | None = None
    cluster: str | None = None
    method: str | None = None
    retry_after: int = 1
    seconds: float = 30.0
    page: int = 0

    def matches(self, cluster: str, method: str, path: str, page: int | None) -> bool:
        if self.remaining <= 0:
            return False
        if self.cluster is not None and self.cluster != cluster:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        if self.path_prefix is not None and not path.startswith(self.path_prefix):
            return False
        if self.kind == "page":
            return page == self.page
        return True


class Faults:
    """Every fault knob; thread-safe through the state lock."""

    def __init__(self, state: SimState):
        self.state = state
        self._api: list[ApiFault] = []
        self._api_lock = threading.Lock()

    # --- Kubernetes API ---------------------------------------------------------------

    def api_error(
        self,
        count: int = 1,
        *,
        status: int = 500,
        path_prefix: str | None = None,
        cluster: str | None = None,
        method: str | None = None,
        retry_after: int = 1,
    ) -> ApiFault:
        """The next `count` matching API requests answer `status` (500, 429 + Retry-After,
        503, ...) with a Status body."""
        return self._add(
            ApiFault(
                "error",
                count,
                status=status,
                path_prefix=path_prefix,
                cluster=cluster,
                method=method,
                retry_after=retry_after,
            )
        )

    def api_timeout(
        self,
        count: int = 1,
        *,
        seconds: float = 30.0,
        path_prefix: str | None = None,
        cluster: str | None = None,
        method: str | None = None,
    ) -> ApiFault:
        """The next `count` matching requests hang `seconds` (then answer 504 Timeout)."""
        return self._add(
            ApiFault(
                "timeout", count, status=504, path_prefix=path_prefix, cluster=cluster, method=method, seconds=seconds
            )
        )

    def api_page_error(
        self,
        page: int = 2,
        *,
        status: int = 500,
        path_prefix: str | None = None,
        cluster: str | None = None,
        count: int = 1,
    ) -> ApiFault:
        """Page `page` (1 = the request without a continue token) of a paged list fails:
        500 InternalError, or 410 Expired ("continue token expired")."""
        return self._add(ApiFault("page", count, status=status, path_prefix=path_prefix, cluster=cluster, page=page))

    def _add(self, fault: ApiFault) -> ApiFault:
        with self._api_lock:
            self._api.append(fault)
        return fault

    def take_api_fault(self, cluster: str, method: str, path: str, page: int | None) -> ApiFault | None:
        """The first armed fault matching this request, with one use consumed."""
        with self._api_lock:
            for fault in self._api:
                if fault.matches(cluster, method, path, page):
                    fault.remaining -= 1
                    self._api = [f for f in self._api if f.remaining > 0]
                    return fault
        return None

    def api_faults(self) -> list[dict]:
        with self._api_lock:
            return [asdict(f) for f in self._api]

    # --- nodes ------------------------------------------------------------------------

    def node_vanish(self, cluster: str | None, node: str) -> None:
        """Delete the node from the API (its pods are garbage-collected, as pod GC would)."""
        from . import scheduler

        with self.state.lock:
            c = self.state.cluster(cluster)
            c.remove_node(node).assigned.clear()
            for key, record in list(c.pods.items()):
                if record.obj["spec"].get("nodeName") == node:
                    scheduler.remove_pod(c, key)
            scheduler.retry_pending(c)

    def node_ready(self, cluster: str | None, node: str, ready: bool = False) -> None:
        """Flip the node's Ready condition (False -> status Unknown, as when kubelet stops)."""
        with self.state.lock:
            c = self.state.cluster(cluster)
            n = c.nodes[node]
            n.ready = ready
            c.touch(n)

    # --- GPUs -------------------------------------------------------------------------

    @contextmanager
    def _gpu(self, cluster: str | None, node: str, gpu: int):
        """Under the state's lock: the cluster, the node and its GPU `gpu` (each fault below changes them)."""
        with self.state.lock:
            c = self.state.cluster(cluster)
            n = c.nodes[node]
            yield c, n, n.gpu(gpu)

    def gpu_lost(self, cluster: str | None, node: str, gpu: int) -> None:
        """The GPU falls off the bus: NVML answers GPU_IS_LOST for it, XID 79 is queued and
        the node's allocatable drops its devices. GFD labels (gpu.count) stay until the
        next relabel, as GFD only notices on restart."""
        from . import gpuoperator

        with self._gpu(cluster, node, gpu) as (c, n, g):
            g.lost = True
            c.push_event(n, g.index, EVENT_XID, XID_FALLEN_OFF_BUS)
            gpuoperator.refresh_devices(c, n)

    def xid(self, cluster: str | None, node: str, gpu: int, code: int = 79, gpu_instance: int | None = None) -> None:
        """Queue an XID critical-error event on the GPU (optionally for one GI)."""
        with self._gpu(cluster, node, gpu) as (c, n, g):
            c.push_event(n, g.index, EVENT_XID, int(code), gpu_instance)

    def ecc_double_bit(self, cluster: str | None, node: str, gpu: int, count: int = 1) -> None:
        """Uncorrectable (double-bit) ECC errors: volatile and aggregate counters grow and a
        DoubleBitEccError event is queued."""
        self._ecc(cluster, node, gpu, count, "uncorrected", EVENT_DOUBLE_BIT_ECC)

    def ecc_single_bit(self, cluster: str | None, node: str, gpu: int, count: int = 1) -> None:
        self._ecc(cluster, node, gpu, count, "corrected", EVENT_SINGLE_BIT_ECC)

    def _ecc(self, cluster: str | None, node: str, gpu: int, count: int, kind: str, event: int) -> None:
        """`count` more ECC errors of `kind` (corrected, uncorrected) in both counters, and the NVML event queued."""
        with self._gpu(cluster, node, gpu) as (c, n, g):
            for counter in (f"ecc_{kind}_volatile", f"ecc_{kind}_aggregate"):
                setattr(g, counter, getattr(g, counter) + count)
            c.push_event(n, g.index, event, 0)

    def row_remap_pending(self, cluster: str | None, node: str, gpu: int, uncorrectable: int = 1) -> None:
        """A row remap is pending (needs a GPU reset): nvmlDeviceGetRemappedRows shows it."""
        with self._gpu(cluster, node, gpu) as (_, _, g):
            g.remapped_uncorrectable += uncorrectable
            g.remap_pending = True

    def thermal_throttle(self, cluster: str | None, node: str, gpu: int, on: bool = True) -> None:
        """Set SW+HW thermal slowdown clock-event reasons; temperature rises, power drops."""
        with self._gpu(cluster, node, gpu) as (_, _, g):
            g.thermal_throttle = on

    # --- trespass ----------------------------------------------------------------------

    def trespass(
        self,
        cluster: str | None,
        node: str,
        resource: str = "nvidia.com/gpu",
        namespace: str = "intruder",
        pod: str = "",
    ) -> dict:
        """A real trespass: a pod that no pool reserved for it takes a GPU unit. The namespace is created if
        missing (by default one that is no gpuaas project's; name a project's namespace for a pod of a project
        on a unit it holds no allocation for), and the pod asks for one `resource` on `node`, past gpuaas's
        quota and node selector as a cluster administrator would. The device plugin hands it a free device of
        that resource on the node, exactly as it would any pod, and NVML shows its process there.
        Returns {"pod": "<namespace>/<name>", "node": ..., "devices": [uuid, ...]}; ValueError when the node
        has no free device of that resource (the pod would only wait, Pending)."""
        from . import scheduler
        from .kube import ClusterApi

        with self.state.lock:
            c = self.state.cluster(cluster)
            if node not in c.nodes:
                raise ValueError(f"no node {node!r} in cluster {c.name!r}")
            name = pod or f"trespass-{len([k for k in c.pods if k[0] == namespace]) + 1}"
            api = ClusterApi(c)
            if namespace not in c.namespaces:
                api.create("namespaces", None, {"metadata": {"name": namespace}})
            body = {
                "metadata": {"name": name, "namespace": namespace, "labels": {"gpuaas.io/sim-fault": "trespass"}},
                "spec": {
                    "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {resource: "1"}}}],
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                },
            }
            api.create("pods", namespace, body)
            devices = sorted(d.split("::")[0] for d, key in c.nodes[node].assigned.items() if key == (namespace, name))
            if not devices:
                scheduler.remove_pod(c, (namespace, name))
                raise ValueError(f"node {node!r} has no free {resource} device: the pod would wait, Pending")
            return {"pod": f"{namespace}/{name}", "node": node, "devices": devices}

    # --- reset and HTTP ---------------------------------------------------------------

    def reset(self) -> None:
        from . import gpuoperator

        with self._api_lock:
            self._api.clear()
        with self.state.lock:
            for c in self.state.clusters.values():
                for name in list(c.vanished):
                    c.restore_node(name)
                for n in c.nodes.values():
                    changed = not n.ready or any(g.lost for g in n.gpus)
                    n.ready = True
                    for g in n.gpus:
                        g.lost = False
                        g.ecc_corrected_volatile = g.ecc_uncorrected_volatile = 0
                        g.ecc_corrected_aggregate = g.ecc_uncorrected_aggregate = 0
                        g.remapped_correctable = g.remapped_uncorrectable = 0
                        g.remap_pending = g.remap_failure = False
                        g.thermal_throttle = False
                    if changed:
                        gpuoperator.refresh_devices(c, n)

    # The knobs that act on a cluster (apply() fills in the default one), then the whole simulator's.
    _CLUSTER_SCOPED = (
        "node_vanish",
        "node_ready",
        "gpu_lost",
        "xid",
        "ecc_double_bit",
        "ecc_single_bit",
        "row_remap_pending",
        "thermal_throttle",
        "trespass",
    )
    KNOBS = ("api_error", "api_timeout", "api_page_error", *_CLUSTER_SCOPED, "reset")

    def apply(self, spec: dict, *, default_cluster: Cluster | None = None) -> dict:
        """Run one knob from its JSON form: {"fault": name, ...kwargs}."""
        spec = dict(spec)
        name = spec.pop("fault", None)
        if name not in self.KNOBS:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(self.KNOBS)}")
        if name in self._CLUSTER_SCOPED:
            spec.setdefault("cluster", default_cluster.name if default_cluster else None)
        result = getattr(self, name)(**spec)
        if isinstance(result, ApiFault):
            return asdict(result)
        return result if isinstance(result, dict) else {"ok": True}
