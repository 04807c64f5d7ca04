"""Inventory: what discovery reads from one node's NVML (GPUs, MIG devices with their placements, processes).

A GPU lost at any step (NVML_ERROR_GPU_IS_LOST) comes back with health "lost" and nothing else
about it is trusted. Reading is partial rather than all-or-nothing: a GPU whose read fails with
another NVML error comes back `unread` (with the error), and GPU-instance calls an unprivileged
agent is refused (NVML_ERROR_NO_PERMISSION) leave the MIG devices' profile and placement unknown;
both become node-level `warnings` naming what is missing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import pynvml

from .sessions import (
    MIB,
    GpuLost,
    NvmlSession,
    as_text,
    is_nvml_error,
    node_errors,
    session,
)

HEALTH_OK = "ok"
HEALTH_LOST = "lost"


@dataclass(slots=True)
class ProcessInfo:
    pid: int
    used_memory_mib: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    pod_uid: str | None = None
    sm_util_pct: int | None = None  # nvmlDeviceGetProcessUtilization: SM utilisation over the last samples


@dataclass(slots=True)
class MigDeviceInfo:
    """One MIG device: a compute instance in a GPU instance, with its GI placement."""

    index: int
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int | None
    placement_start: int | None
    placement_size: int | None
    memory_mib: int | None
    processes: list[ProcessInfo] = field(default_factory=list)


@dataclass(slots=True)
class GpuInfo:
    index: int
    health: str
    uuid: str | None = None
    name: str = ""
    serial: str | None = None
    pci_bus_id: str | None = None
    memory_mib: int | None = None
    mig_current: bool = False
    mig_pending: bool = False
    mig_devices: list[MigDeviceInfo] = field(default_factory=list)
    processes: list[ProcessInfo] = field(default_factory=list)
    error: str = ""
    nvlink_group: int | None = None  # the lowest index of the GPUs it reaches over NVLink; None: no NVLink peer
    pcie_group: int | None = None  # the lowest index of the GPUs below the same PCIe host bridge; None: none
    numa_group: int | None = None  # the lowest index of the GPUs on the same NUMA node; None: none

    @property
    def lost(self) -> bool:
        return self.health == HEALTH_LOST

    @property
    def unread(self) -> bool:
        """NVML failed part-way through this GPU (not lost): what was read is not the whole truth."""
        return bool(self.error) and not self.lost


@dataclass(slots=True)
class NodeInventory:
    node_name: str
    driver_version: str = ""
    cuda_version: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def privilege_warning(denied: list[str]) -> str:
    """The node-level warning for calls refused with NO_PERMISSION, naming the privilege that is missing."""
    return (
        f"NVML refused {', '.join(denied)} (NVML_ERROR_NO_PERMISSION): the node agent is not privileged. "
        "Run it as root, or grant the MIG monitor capability (/proc/driver/nvidia/capabilities/mig/monitor). "
        "MIG placements are unknown: recorded MIG instances are kept, new ones are not recorded."
    )


def _cuda_version(raw: Any) -> str:
    """12040 -> "12.4" (nvmlSystemGetCudaDriverVersion returns major*1000 + minor*10)."""
    if raw is None:
        return ""
    raw = int(raw)
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def read_processes(s: NvmlSession, handle: Any) -> list[ProcessInfo]:
    procs = s.optional("nvmlDeviceGetComputeRunningProcesses", handle) or []
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        gi = getattr(p, "gpuInstanceId", None)
        ci = getattr(p, "computeInstanceId", None)
        out.append(
            ProcessInfo(
                pid=int(p.pid),
                used_memory_mib=None if used is None else int(used) // MIB,
                gpu_instance_id=None if gi is None or gi == 0xFFFFFFFF else int(gi),
                compute_instance_id=None if ci is None or ci == 0xFFFFFFFF else int(ci),
                pod_uid=s.pod_uid_for_pid(int(p.pid)),
            )
        )
    return out


def read_process_utilization(s: NvmlSession, handle: Any, processes: list[ProcessInfo]) -> None:
    """Fill each process's SM utilisation from nvmlDeviceGetProcessUtilization (whole GPUs only; MIG
    devices do not report it). Processes without a recent sample keep None (not measured)."""
    samples = s.optional("nvmlDeviceGetProcessUtilization", handle, 0) or []
    by_pid: dict[int, int] = {}
    for sample in samples:
        by_pid[int(sample.pid)] = max(by_pid.get(int(sample.pid), 0), int(sample.smUtil))
    for process in processes:
        process.sm_util_pct = by_pid.get(process.pid, process.sm_util_pct)


def _mig_devices(s: NvmlSession, handle: Any) -> list[MigDeviceInfo]:
    """Walk the MIG device handles; each GI id maps to its profile and placement through the GI."""
    count = s.optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    placements: dict[int, tuple[int | None, int | None, int | None]] = {}
    devices = []
    for i in range(int(count)):
        mig = s.optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is None:  # an empty slot: NotFound
            continue
        gi_id = int(s.call("nvmlDeviceGetGpuInstanceId", mig))
        ci_id = int(s.call("nvmlDeviceGetComputeInstanceId", mig))
        if gi_id not in placements:
            gi = s.permitted("nvmlDeviceGetGpuInstanceById", handle, gi_id)
            info = s.optional("nvmlGpuInstanceGetInfo", gi) if gi is not None else None
            placements[gi_id] = (
                (int(info.profileId), int(info.placement.start), int(info.placement.size))
                if info is not None
                else (None, None, None)
            )
        profile_id, start, size = placements[gi_id]
        memory = s.optional("nvmlDeviceGetMemoryInfo", mig)
        devices.append(
            MigDeviceInfo(
                index=i,
                uuid=as_text(s.call("nvmlDeviceGetUUID", mig)) or "",
                gpu_instance_id=gi_id,
                compute_instance_id=ci_id,
                profile_id=profile_id,
                placement_start=start,
                placement_size=size,
                memory_mib=None if memory is None else int(memory.total) // MIB,
                processes=read_processes(s, mig),
            )
        )
    return devices


def gpu_info(s: NvmlSession, index: int) -> GpuInfo:
    """One GPU by index; a GPU that is lost (at any step) comes back as GpuInfo(health="lost")."""
    gpu = GpuInfo(index=index, health=HEALTH_OK)
    try:
        handle = s.call("nvmlDeviceGetHandleByIndex", index)
        gpu.uuid = as_text(s.call("nvmlDeviceGetUUID", handle))
        gpu.name = as_text(s.optional("nvmlDeviceGetName", handle)) or ""
        gpu.serial = as_text(s.optional("nvmlDeviceGetSerial", handle))
        pci = s.optional("nvmlDeviceGetPciInfo", handle)
        gpu.pci_bus_id = as_text(pci.busId) if pci is not None else None
        memory = s.optional("nvmlDeviceGetMemoryInfo", handle)
        gpu.memory_mib = None if memory is None else int(memory.total) // MIB
        mode = s.optional("nvmlDeviceGetMigMode", handle)
        if mode is not None:
            gpu.mig_current, gpu.mig_pending = bool(mode[0]), bool(mode[1])
        if gpu.mig_current:
            gpu.mig_devices = _mig_devices(s, handle)
        else:
            gpu.processes = read_processes(s, handle)
    except GpuLost as exc:
        gpu.health = HEALTH_LOST
        gpu.error = f"GPU is lost ({exc})"
        gpu.mig_devices = []
        gpu.processes = []
    except Exception as exc:
        if not is_nvml_error(exc):
            raise
        gpu.error = f"NVML error while reading GPU {index}: {exc}"
    return gpu


def _pci_key(bus_id: Any) -> tuple[int, ...] | None:
    """A PCI address as numbers: NVML writes the domain with 8 hex digits in one place and 4 in another."""
    try:
        domain, bus, rest = as_text(bus_id).strip().split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except (AttributeError, ValueError):
        return None


def _nvlink_ends(s: NvmlSession, handle: Any) -> list[tuple[int, ...]]:
    """Where the GPU's active NVLinks end (nvmlDeviceGetNvLinkRemotePciInfo_v2): a peer GPU over an NVLink
    bridge, or an NVSwitch, whose PCI address the GPUs of an HGX board share. Links are numbered from 0;
    past the GPU's last one NVML says NVML_ERROR_INVALID_ARGUMENT, and a GPU without NVLink NOT_SUPPORTED."""
    ends = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = s.optional("nvmlDeviceGetNvLinkState", handle, link)
        except Exception as exc:
            if is_nvml_error(exc):
                break
            raise
        if state is None:
            break
        if state != pynvml.NVML_FEATURE_ENABLED:
            continue
        end = _pci_key(getattr(s.optional("nvmlDeviceGetNvLinkRemotePciInfo", handle, link), "busId", None))
        if end is not None:
            ends.append(end)
    return ends


def _groups(indices: list[int], edges) -> dict[int, int | None]:
    """{GPU index: the lowest index of its connected set, None when alone}, over `edges` between any keys
    (GPU indices, or the PCI address of an NVSwitch that several GPUs reach)."""
    parent: dict[Any, Any] = {}

    def root(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
    members: dict[Any, list[int]] = {}
    for index in indices:
        members.setdefault(root(index), []).append(index)
    return {i: min(m) if len(m) > 1 else None for m in members.values() for i in m}


def _best_effort(read):
    """Topology is a preference, never a reason to fail the inventory: an NVML error leaves it unknown."""

    @functools.wraps(read)
    def wrapper(s: NvmlSession, gpus: list[GpuInfo]) -> None:
        try:
            read(s, gpus)
        except GpuLost:
            return
        except Exception as exc:
            if not is_nvml_error(exc):
                raise

    return wrapper


@_best_effort
def read_nvlink_groups(s: NvmlSession, gpus: list[GpuInfo]) -> None:
    """Set each GPU's `nvlink_group`: GPUs joined by NVLink, directly (a bridge: the link's remote PCI
    address is the peer GPU's) or through NVSwitch (the remote is a switch several GPUs reach), as
    nvmlDeviceGetNvLinkRemotePciInfo_v2 says for each active link. A GPU without an NVLink peer keeps None."""
    readable = [g for g in gpus if not g.lost and g.uuid]
    by_bus = {_pci_key(g.pci_bus_id): g.index for g in readable if _pci_key(g.pci_bus_id)}
    edges = []
    for gpu in readable:
        for end in _nvlink_ends(s, s.call("nvmlDeviceGetHandleByIndex", gpu.index)):
            edges.append((gpu.index, by_bus.get(end, ("nvswitch", end))))
    groups = _groups([g.index for g in readable], edges)
    for gpu in gpus:
        gpu.nvlink_group = groups.get(gpu.index)


@_best_effort
def read_pcie_groups(s: NvmlSession, gpus: list[GpuInfo]) -> None:
    """Set each GPU's `pcie_group` (GPUs below one PCIe host bridge: nvmlDeviceGetTopologyCommonAncestor
    at most NVML_TOPOLOGY_HOSTBRIDGE) and `numa_group` (at most NVML_TOPOLOGY_NODE: one CPU socket).
    Multi-GPU work without NVLink between its GPUs is better off near each other on PCIe."""
    readable = [g for g in gpus if not g.lost and g.uuid]
    handles = {g.index: s.call("nvmlDeviceGetHandleByIndex", g.index) for g in readable}
    levels = []
    for a, b in combinations(sorted(handles), 2):
        level = s.optional("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
        if level is None:
            return
        levels.append((a, b, int(level)))
    indices = sorted(handles)
    pcie = _groups(indices, [(a, b) for a, b, level in levels if level <= pynvml.NVML_TOPOLOGY_HOSTBRIDGE])
    numa = _groups(indices, [(a, b) for a, b, level in levels if level <= pynvml.NVML_TOPOLOGY_NODE])
    for gpu in gpus:
        gpu.pcie_group, gpu.numa_group = pcie.get(gpu.index), numa.get(gpu.index)


def node_inventory(api_url: str, node_name: str) -> NodeInventory:
    """Everything discovery needs from one node's NVML: GPUs, MIG devices with placements, processes."""
    with session(api_url, node_name) as s:
        with node_errors(node_name):
            inventory = NodeInventory(
                node_name=node_name,
                driver_version=as_text(s.optional("nvmlSystemGetDriverVersion")) or "",
                cuda_version=_cuda_version(s.optional("nvmlSystemGetCudaDriverVersion")),
            )
            count = int(s.call("nvmlDeviceGetCount"))
        inventory.gpus = [gpu_info(s, i) for i in range(count)]
        read_nvlink_groups(s, inventory.gpus)
        read_pcie_groups(s, inventory.gpus)
        inventory.warnings = [gpu.error for gpu in inventory.gpus if gpu.unread]
        if s.denied:
            inventory.warnings.insert(0, privilege_warning(s.denied))
        return inventory
