"""The NVML adapter: what a node agent reads from, and writes to, the GPUs of its own node.

The only code in gpuaas that imports pynvml. Split by job:

- sessions: loading the library through settings.NVML_LIBRARY (`local_pynvml` on real GPU nodes,
  the simulator's fake NVML under the simulator) and `session()`, nvmlInit/nvmlShutdown around a
  block, whose helpers turn NVML errors into values (NotSupported, NotFound, NoData -> None;
  GpuIsLost -> the GPU is reported "lost" and nothing else about it is trusted);
- inventory: `node_inventory()` for discovery (GPUs, MIG devices with placements, processes);
- layout: `apply_gpu_layout()` for MIG reconfiguration;
- metrics: `node_metrics()` for monitoring (counters, GPM SM activity, XID events);
- vgpu: `node_vgpus()` on vm-vgpu hosts (active vGPUs, type, mdev UUID, framebuffer, per-vGPU utilisation).

Everything is returned as plain dataclasses; nothing outside this package touches NVML handles.
"""

from .inventory import (
    HEALTH_LOST,
    HEALTH_OK,
    GpuInfo,
    MigDeviceInfo,
    NodeInventory,
    ProcessInfo,
    gpu_info,
    node_inventory,
)
from .layout import LayoutError, apply_gpu_layout
from .metrics import GpuMetrics, MigMetrics, XidEvent, forget_xid_watchers, node_metrics
from .sessions import GpuLost, NvmlError, NvmlSession, load_library, local_pynvml, pod_uid_from_cgroup, session
from .vgpu import VgpuMetrics, node_vgpus, read_vgpus

__all__ = [
    "HEALTH_LOST",
    "HEALTH_OK",
    "GpuInfo",
    "GpuLost",
    "GpuMetrics",
    "LayoutError",
    "MigDeviceInfo",
    "MigMetrics",
    "NodeInventory",
    "NvmlError",
    "NvmlSession",
    "ProcessInfo",
    "VgpuMetrics",
    "XidEvent",
    "apply_gpu_layout",
    "forget_xid_watchers",
    "gpu_info",
    "load_library",
    "local_pynvml",
    "node_inventory",
    "node_metrics",
    "node_vgpus",
    "pod_uid_from_cgroup",
    "read_vgpus",
    "session",
]
