"""The simulator's state: clusters, nodes with their GPUs, and stored Kubernetes objects.

One `SimState` holds every cluster behind ONE re-entrant lock. The API server, the fake
NVML host, the GPU Operator reactions and the metric ticker all take that lock, so every
view (Kubernetes JSON, NVML, metrics) is of the same consistent state.

Everything is deterministic given the seed and the sequence of operations: identifiers
come from hashes of (seed, cluster, node, index, ...), never from `uuid4()` or wall time.
Simulated time (`sim_time`) only moves when `tick()` is called (the runner ticks once a
second in a background thread; tests tick explicitly).
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from capacity.mig.catalog import Product

from .hardware import Gpu, LoadModel, stable_hex, uuid_from

if TYPE_CHECKING:
    from .rbac import Access, Role

# 2026-01-01T00:00:00Z: simulated wall clock at sim_time 0.
SIM_EPOCH = 1767225600

# PCI buses of the eight SXM GPUs on an HGX H100 baseboard (a common real layout).
_HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

# Event ring size per node; consumers that fall further behind lose the oldest events.
_EVENT_RING = 1024


@dataclass
class ClusterSettings:
    """What the cluster's GPU Operator ClusterPolicy and nodes report."""

    driver_version: str = "550.54.15"
    cuda_version: str = "12.4"
    kubernetes_version: str = "v1.31.4"
    operator_namespace: str = "gpu-operator"
    # ClusterPolicy spec.migManager.config.name; None = not set (see gpuoperator lookup order).
    mig_config_name: str | None = None
    # ClusterPolicy spec.devicePlugin.config.name / .default.
    device_plugin_config_name: str = "time-slicing-config"
    device_plugin_default: str | None = None
    machine: str = "HGX-Simulated"
    # The NVIDIA DRA driver for GPUs instead of the device plugin (simcluster/dra.py, docs/dra.md):
    # ResourceSlices per node, DeviceClasses, claims allocated by the scheduler; resource.k8s.io/v1 served.
    dra: bool = False
    # gpuaas's ValidatingAdmissionPolicy (deploy/admission-policy.yaml) installed: only gpuaas writes claim
    # templates, only the resourceclaim controller creates claims, in gpuaas's namespaces (simcluster/admission.py).
    admission_policy: bool = False


@dataclass
class ApiBehaviour:
    """How kube-apiserver and the kubelet behave in time: the unkind knobs (docs/simcluster.md).

    The defaults are the kind world the demo and most tests use (pods Running at once and gone
    at once on delete); tests set the real-world values on `SimState.api`.
    """

    pod_start_delay_s: float = 0.0  # bound -> Running; Pending with ContainerCreating meanwhile
    pod_termination_grace_s: float = 0.0  # at most this long Terminating (capped by the pod's grace period)
    watch_window: int = 10_000  # watch events kept (etcd compaction): older resourceVersions get 410 Gone
    watch_bookmark_s: float = 60.0  # BOOKMARK interval for allowWatchBookmarks watches (kube-apiserver: ~1 min)
    watch_timeout_s: float = 1800.0  # a watch without timeoutSeconds ends after this (--min-request-timeout)
    list_snapshots: int = 64  # unfinished paged lists whose remaining pages are kept (continue tokens)
    # RBAC (simcluster/rbac.py): a Role that every resource request must pass (None: allow all, as
    # cluster-admin), and a callable told of each request's rbac.Access and User-Agent (a recorder).
    role: Role | None = None
    on_request: Callable[[Access, str], None] | None = None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change at resourceVersion `rv`. `source` is the object's JSON at that version, or, for
    a node's ADDED/MODIFIED, the live Node (rendered when served and skipped if it changed since:
    node events coalesce, which level-triggered node watchers tolerate)."""

    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    plural: str
    key: object  # node name, namespace name, or (namespace, name)
    source: object


@dataclass
class Sharing:
    """The effective device-plugin sharing config of one node."""

    strategy: str  # time-slicing | mps
    replicas: dict[str, int]  # resource name -> replicas (only > 1 kept)
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False

    def replicas_for(self, resource: str) -> int:
        return self.replicas.get(resource, 1)

    def advertised_name(self, resource: str) -> str:
        return f"{resource}.shared" if self.rename_by_default and self.replicas_for(resource) > 1 else resource


@dataclass
class MigJob:
    """A pending `nvidia.com/mig.config` change the simulated mig-manager will apply."""

    config: str
    due: float  # time.monotonic() deadline
    rebooting: bool = False  # the manager rebooted the node for a MIG mode change and resumes after it


@dataclass(eq=False)
class Node:
    name: str
    uid: str
    created: str
    address: str
    gpus: list[Gpu]
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    mig_strategy: str = "none"
    unschedulable: bool = False
    taints: list[dict] = field(default_factory=list)
    ready: bool = True
    resource_version: str = "1"
    sharing: Sharing | None = None
    sharing_key: str | None = None  # device-plugin config key currently applied
    gfd_keys: set[str] = field(default_factory=set)  # label keys GFD wrote last time
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> healthy device ids
    device_capacity: dict[str, int] = field(default_factory=dict)  # resource -> all device ids
    known_resources: set[str] = field(default_factory=set)
    assigned: dict[str, tuple[str, str]] = field(default_factory=dict)  # device id -> pod key
    mig_job: MigJob | None = None
    # The vGPU device manager (simcluster.vgpudm): the type it applied (None: the scenario's label stands),
    # its pending job (MigJob.config is the nvidia.com/vgpu.config value) and its last outcome.
    vgpu_type: str | None = None
    vgpu_job: MigJob | None = None
    vgpu_message: str = ""
    device_plugin_pod: str | None = None  # its DaemonSet pod's name (SimState.device_plugin_restart)
    mig_message: str = ""  # outcome of the last MIG manager run (shown by /sim/v1/info)
    pod_resources: str = "ok"  # the kubelet PodResources socket: ok, missing, denied, old-kubelet (podresources.py)
    events: deque = field(default_factory=lambda: deque(maxlen=_EVENT_RING))
    event_seq: int = 0
    json_cache: bytes | None = None

    @property
    def pod_cidr(self) -> str:
        """This node's /24 of the pod network (10.128.0.0/9), unique per node address."""
        octets = self.address.split(".")
        return f"10.{128 + int(octets[2]) % 128}.{octets[3]}.0/24"

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"node {self.name} has no GPU {index}")


class Record:
    """A stored Kubernetes object (namespace, pod, configmap, quota) and its cached JSON."""

    __slots__ = ("obj", "raw")

    def __init__(self, obj: dict):
        self.obj = obj
        self.raw: bytes | None = None


class Cluster:
    """One simulated Kubernetes cluster. Mutate only while holding `state.lock`."""

    def __init__(self, state: SimState, name: str, settings: ClusterSettings):
        self.state = state
        self.name = name
        self.settings = settings
        self.rv = 1
        self.nodes: dict[str, Node] = {}
        self.vanished: dict[str, Node] = {}
        self.namespaces: dict[str, Record] = {}
        self.pods: dict[tuple[str, str], Record] = {}
        self.configmaps: dict[tuple[str, str], Record] = {}
        self.resourcequotas: dict[tuple[str, str], Record] = {}
        # resource.k8s.io/v1 (served when settings.dra): slices by name, classes by name, claims and templates by key.
        self.resourceslices: dict[str, Record] = {}
        self.deviceclasses: dict[str, Record] = {}
        self.resourceclaims: dict[tuple[str, str], Record] = {}
        self.resourceclaimtemplates: dict[tuple[str, str], Record] = {}
        # scheduling.k8s.io/v1: PriorityClasses by name (stored; the scheduler does not preempt by them).
        self.priorityclasses: dict[str, Record] = {}
        # policy/v1: PodDisruptionBudgets by key; the eviction subresource honours them (simcluster.disruption).
        self.poddisruptionbudgets: dict[tuple[str, str], Record] = {}
        # kubevirt.io/v1 VirtualMachineInstances by key (simcluster.kubevirt); launcher pods refused, by VMI uid.
        self.virtualmachineinstances: dict[tuple[str, str], Record] = {}
        self.vmi_errors: dict[str, str] = {}
        # KubeVirt CRs by key (simcluster.kubevirt_cr); VMIs waiting for a host device no CR permits, by uid.
        self.kubevirts: dict[tuple[str, str], Record] = {}
        self.vmi_waiting: dict[str, str] = {}
        # Stored only (what onboarding applies): ServiceAccounts, DaemonSets (no pods are made from them), RBAC
        # and ValidatingAdmissionPolicies (admission enforces deploy/'s policies, simcluster.admission).
        self.serviceaccounts: dict[tuple[str, str], Record] = {}
        self.daemonsets: dict[tuple[str, str], Record] = {}
        self.clusterroles: dict[str, Record] = {}
        self.clusterrolebindings: dict[str, Record] = {}
        self.validatingadmissionpolicies: dict[str, Record] = {}
        self.validatingadmissionpolicybindings: dict[str, Record] = {}
        # The GPU Operator's ClusterPolicy (nvidia.com/v1), stored only: gpuaas reads its driver upgrade policy.
        self.clusterpolicies: dict[str, Record] = {}
        self._dra_held: tuple[int, dict[str, set[str]]] | None = None  # simcluster.dra.held_devices' cache
        # ConfigMap name -> [(time.monotonic() it reaches the MIG manager's mounted copy, config.yaml text)]:
        # kubelet's delayed refresh of a mounted ConfigMap (gpuoperator.mounted_config_text).
        self.mounted: dict[str, list[tuple[float, str | None]]] = {}
        self._node_order: list[str] | None = None
        self._serial = 0
        self.watch_events: deque[WatchEvent] = deque()
        self.compacted_rv = 1  # watches from, and continue tokens of, an older resourceVersion get 410
        self.list_snapshots: OrderedDict[str, tuple[int, list[tuple[str, bytes]]]] = OrderedDict()
        self.pod_timers: dict[tuple[str, str], tuple[float, str]] = {}  # pod key -> (monotonic due, "start"|"gone")

    # --- bookkeeping ------------------------------------------------------------------

    def bump(self) -> str:
        """Advance the cluster's resourceVersion (one counter, like etcd's revision)."""
        self.rv += 1
        return str(self.rv)

    def new_uid(self, *parts: object) -> str:
        self._serial += 1
        return uuid_from(self.state.seed, self.name, "uid", self._serial, *parts)

    def node_names(self) -> list[str]:
        if self._node_order is None:
            self._node_order = sorted(self.nodes)
        return self._node_order

    def touch(self, node: Node, event: str = "MODIFIED") -> None:
        """Record a change to a node: new resourceVersion, drop its cached JSON, tell watchers."""
        node.resource_version = self.bump()
        node.json_cache = None
        self.record_event(event, "nodes", node.name, node)

    def record_event(self, type_: str, plural: str, key: object, source: object) -> None:
        """Log a change at the current resourceVersion for watches; the oldest beyond the window are
        compacted away, like etcd's history, and so are the paged-list snapshots that old."""
        if isinstance(source, Record):  # stored objects: their JSON now, so no change is lost to a watcher
            if source.raw is None:
                source.raw = json.dumps(source.obj, separators=(",", ":"), ensure_ascii=False).encode()
            source = source.raw
        with self.state.lock:  # re-entrant: the API server holds it already; direct callers (tests, set-up) may not
            self.watch_events.append(WatchEvent(self.rv, type_, plural, key, source))
            window = self.state.api.watch_window
            while len(self.watch_events) > window:
                self.compacted_rv = self.watch_events.popleft().rv
            self.state.kube_changed.notify_all()

    def compact(self) -> None:
        """Forget all history now (an etcd compaction): older watches and continue tokens get 410."""
        self.watch_events.clear()
        self.compacted_rv = self.rv
        self.list_snapshots.clear()

    # --- nodes ------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        product: Product,
        gpu_count: int,
        *,
        mig_strategy: str = "none",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> Node:
        """Create a node with `gpu_count` GPUs of `product` (MIG off, no GFD labels yet)."""
        seed = self.state.seed
        ordinal = len(self.nodes) + len(self.vanished)
        gpus = []
        for i in range(gpu_count):
            bus = _HGX_BUSES[i] if i < len(_HGX_BUSES) else f"{0xE0 + i:02X}"
            gpus.append(
                Gpu(
                    index=i,
                    product=product,
                    uuid="GPU-" + uuid_from(seed, self.name, name, "gpu", i),
                    serial=str(1650000000000 + int(stable_hex(seed, self.name, name, "serial", i)[:10], 16) % 10**10),
                    pci_bus_id=f"00000000:{bus}:00.0",
                    load=LoadModel.seeded(seed, self.name, name, i),
                    # Energy counter since driver load: days of history, not zero.
                    energy_mj=2e9 + 6e9 * int(stable_hex(seed, self.name, name, "energy", i)[:8], 16) / 2**32,
                )
            )
        node = Node(
            name=name,
            uid=uuid_from(seed, self.name, name, "node"),
            created=self.state.timestamp(),
            address=f"10.{(ordinal + 1) >> 16 & 255}.{(ordinal + 1) >> 8 & 255}.{(ordinal + 1) & 255}",
            gpus=gpus,
            mig_strategy=mig_strategy,
            labels={
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                **(labels or {}),
            },
            annotations={
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                **(annotations or {}),
            },
        )
        self.nodes[name] = node
        self._node_order = None
        self.touch(node, "ADDED")
        return node

    def remove_node(self, name: str) -> Node:
        """Delete a node (kept aside so a fault reset can bring it back)."""
        from .kube import node_json

        node = self.nodes.pop(name)
        self._node_order = None
        self.vanished[name] = node
        node.resource_version = self.bump()
        node.json_cache = None
        self.record_event("DELETED", "nodes", name, node_json(self, node))
        node.json_cache = None
        return node

    def restore_node(self, name: str) -> Node:
        node = self.vanished.pop(name)
        self.nodes[name] = node
        self._node_order = None
        self.touch(node, "ADDED")
        return node

    def iter_nodes_from(self, after: str | None):
        """Nodes in name order, starting after `after` (paging)."""
        names = self.node_names()
        start = 0 if after is None else bisect.bisect_right(names, after)
        for name in names[start:]:
            yield self.nodes[name]

    # --- events -----------------------------------------------------------------------

    def push_event(self, node: Node, gpu_index: int, event_type: int, data: int, gi: int | None = None) -> None:
        """Queue an NVML event (XID etc.) on a node and wake NVML event waiters."""
        node.event_seq += 1
        node.events.append(
            {
                "seq": node.event_seq,
                "gpu": gpu_index,
                "type": event_type,
                "data": data,
                "gi": 0xFFFFFFFF if gi is None else gi,
                "ci": 0xFFFFFFFF if gi is None else 0,
            }
        )
        self.state.events_changed.notify_all()


class SimState:
    """Every simulated cluster, one lock, simulated time and the fault knobs."""

    def __init__(
        self,
        seed: int = 0,
        *,
        mig_manager_delay: float = 0.2,
        configmap_sync_delay: float = 0.0,
        device_plugin_restart: bool = False,
        mig_mode_reboot: bool = False,
        api: ApiBehaviour | None = None,
    ):
        """The unkind knobs (docs/simcluster.md), each off = the kind world:

        - configmap_sync_delay: seconds before a ConfigMap change reaches the MIG manager's mounted copy
          (kubelet's sync period; up to about a minute on a real node).
        - device_plugin_restart: the device plugin keeps the resource list it registered until its pod
          on that node is deleted and recreated (the real plugin does not notice a direct NVML MIG change).
        - mig_mode_reboot: the MIG manager reboots the node (state `rebooting`) to change a GPU's MIG mode.
        """
        self.seed = seed
        self.mig_manager_delay = mig_manager_delay
        self.configmap_sync_delay = configmap_sync_delay
        self.device_plugin_restart = device_plugin_restart
        self.mig_mode_reboot = mig_mode_reboot
        self.api = api or ApiBehaviour()  # the Kubernetes API server's knobs (watch, pod phases)
        self.lock = threading.RLock()
        self.events_changed = threading.Condition(self.lock)
        self.kube_changed = threading.Condition(self.lock)  # woken on every watch event
        self.sim_time = 0.0
        self.clusters: dict[str, Cluster] = {}
        self.scenario_name: str | None = None
        from .faults import Faults  # late: faults reaches into gpuoperator/scheduler

        self.faults = Faults(self)

    def add_cluster(self, name: str, settings: ClusterSettings | None = None) -> Cluster:
        """Create a cluster with the namespaces and GPU Operator ConfigMaps a fresh one has."""
        from . import gpuoperator

        with self.lock:
            if name in self.clusters:
                raise ValueError(f"cluster {name!r} exists")
            cluster = Cluster(self, name, settings or ClusterSettings())
            self.clusters[name] = cluster
            gpuoperator.bootstrap_cluster(cluster)
            return cluster

    def cluster(self, name: str | None = None) -> Cluster:
        """A cluster by name; None = the first one (the default cluster at the server root)."""
        if name is None:
            if not self.clusters:
                raise KeyError("no clusters")
            return next(iter(self.clusters.values()))
        try:
            return self.clusters[name]
        except KeyError:
            raise KeyError(f"no cluster {name!r}; have {', '.join(self.clusters)}") from None

    def timestamp(self) -> str:
        """RFC 3339 time at the current simulated instant."""
        return datetime.fromtimestamp(SIM_EPOCH + int(self.sim_time), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def timestamp_in(self, seconds: float) -> str:
        """RFC 3339 time `seconds` after the current simulated instant."""
        return datetime.fromtimestamp(SIM_EPOCH + int(self.sim_time + seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def epoch(self) -> int:
        return SIM_EPOCH + int(self.sim_time)

    def tick(self, dt: float = 1.0) -> None:
        """Advance simulated time by dt seconds: metrics move, energy accumulates, due
        mig-manager jobs run."""
        from . import scheduler

        with self.lock:
            self.sim_time += dt
            t = self.sim_time
            for cluster in self.clusters.values():
                for node in cluster.nodes.values():
                    work = scheduler.unit_work(cluster, node)
                    for gpu in node.gpus:
                        gpu.update_metrics(t, work.get(gpu.index, {}), dt)
            self.run_mig_manager(due_only=True)
            self.run_kubelet(due_only=True)

    def run_kubelet(self, cluster: str | None = None, *, due_only: bool = False) -> None:
        """Move pods along their phases: start the due ones (or all, for tests), remove the due Terminating."""
        from . import kubevirt, scheduler

        with self.lock:
            targets = [self.cluster(cluster)] if cluster else list(self.clusters.values())
            for c in targets:
                kubevirt.sync(c)
                scheduler.run_pod_timers(c, time.monotonic(), force=not due_only)

    def run_mig_manager(self, cluster: str | None = None, *, due_only: bool = False) -> None:
        """Apply pending `nvidia.com/mig.config` changes now (tests) or only the due ones."""
        from . import gpuoperator

        with self.lock:
            targets = [self.cluster(cluster)] if cluster else list(self.clusters.values())
            for c in targets:
                gpuoperator.run_due_jobs(c, time.monotonic(), force=not due_only)
