"""A dcgm-exporter per node: the text its `/metrics` serves, in the real shape (reference §6).

Served at `GET .../sim/v1/nodes/<node>/dcgm` (one exporter pod per GPU node on a real cluster, port 9400).
What it copies from the real exporter, checked against tests/fixtures/dcgm/:

- Families and types from etc/default-counters.csv (gauges and counters as that file types them), the
  DCP fields the GPU Operator enables (GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE) and the ECC
  volatile/aggregate totals, which default-counters.csv ships commented out: this simulator stands for
  an operator whose collectors CSV turns them on (gpuaas's health rules need them).
- Labels in the exporter's order: gpu, UUID (the parent GPU even on MIG lines), pci_bus_id, device,
  modelName, GPU_I_PROFILE and GPU_I_ID on MIG lines, Hostname, DCGM_FI_DRIVER_VERSION, then the pod
  attributes (container, namespace, pod, pod_uid) when a pod uses the device; XID lines add err_code, err_msg.
- A MIG-enabled GPU has per-instance lines ONLY, no whole-GPU line. Device-level fields (clocks,
  temperatures, power, energy, ECC, XID) repeat the GPU's value on every instance line; per-instance
  fields (framebuffer, DCP activity) carry the instance's own value; fields DCGM does not report for a
  GPU instance (GPU_UTIL, MEM_COPY_UTIL, ENC/DEC_UTIL, remapped rows) are absent, as in the A800 capture.
- A lost GPU has no lines (DCGM cannot read it).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import scheduler
from .driver import NodeGone, gpu_reserved_mib
from .hardware import Gpu, GpuInstance, reserved_mib
from .state import Cluster, Node

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError

# Where a field's value comes from: the physical GPU and repeated on each MIG line ("device"), the unit
# itself ("unit": the GPU, or the GPU instance on a MIG GPU), or whole GPUs only ("full").
DEVICE, UNIT, FULL = "device", "unit", "full"


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # gauge | counter, as the collectors CSV types it
    help: str
    scope: str


FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", DEVICE),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", DEVICE),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", DEVICE),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", DEVICE),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", DEVICE),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).", DEVICE),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", DEVICE),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", FULL),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", FULL),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", FULL),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", FULL),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", DEVICE),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", UNIT),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", UNIT),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.", DEVICE),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.", DEVICE),
    Field("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors.", DEVICE),
    Field("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors.", DEVICE),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes",
        DEVICE,
    ),
    Field("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", DEVICE),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors", FULL
    ),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors", FULL),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", FULL),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", UNIT),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", UNIT),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        UNIT,
    ),
)

# XID err_msg texts the exporter prints (a few; others print the code's generic text).
_XID_MESSAGES = {0: "No Error", 48: "DBE (Double Bit Error) ECC Error", 79: "GPU has fallen off the bus"}


def _last_xid(node: Node, gpu: Gpu) -> int:
    for event in reversed(node.events):
        if event["type"] == EVENT_XID and event["gpu"] == gpu.index:
            return int(event["data"])
    return 0


def _device_values(node: Node, gpu: Gpu) -> dict[str, float]:
    busy = gpu.activity >= 0.05
    return {
        "DCGM_FI_DEV_SM_CLOCK": 1980 if busy else 345,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_MEMORY_TEMP": gpu.temperature_c + 4,
        "DCGM_FI_DEV_GPU_TEMP": gpu.temperature_c,
        "DCGM_FI_DEV_POWER_USAGE": round(gpu.power_w, 3),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(gpu.energy_mj),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_XID_ERRORS": _last_xid(node, gpu),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": gpu.ecc_corrected_volatile,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": gpu.ecc_uncorrected_volatile,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": gpu.ecc_corrected_aggregate,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": gpu.ecc_uncorrected_aggregate,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
        # whole GPUs only
        "DCGM_FI_DEV_GPU_UTIL": int(round(gpu.activity * 100)),
        "DCGM_FI_DEV_MEM_COPY_UTIL": int(round(gpu.activity * 40)),
        "DCGM_FI_DEV_ENC_UTIL": 0,
        "DCGM_FI_DEV_DEC_UTIL": 0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": gpu.remapped_uncorrectable,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": gpu.remapped_correctable,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": int(gpu.remap_failure),
    }


def _unit_values(total_mib: int, used_mib: int, activity: float) -> dict[str, float]:
    return {
        "DCGM_FI_DEV_FB_FREE": max(0, total_mib - used_mib),
        "DCGM_FI_DEV_FB_USED": used_mib,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(activity, 6),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(activity * 0.6, 6),
        "DCGM_FI_PROF_DRAM_ACTIVE": round(activity * 0.5, 6),
    }


def _quote(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: list[tuple[str, object]]) -> str:
    return ",".join(f'{key}="{_quote(value)}"' for key, value in pairs)


def _format(value: float) -> str:
    return f"{value:f}" if isinstance(value, float) else str(value)


@dataclass
class _Line:
    """One entity's lines: a whole GPU (gi None) or one GPU instance of a MIG GPU."""

    labels: list[tuple[str, object]]
    values: dict[str, float]
    pod: list[tuple[str, object]]


def _pods(cluster: Cluster, node: Node) -> dict[tuple[int, int | None], list[tuple[str, object]]]:
    """(GPU index, GI id or None) -> the pod attributes of the first pod using that unit."""
    found: dict[tuple[int, int | None], list[tuple[str, object]]] = {}
    for proc in scheduler.processes(cluster, node):
        key = (proc["gpu"], proc["gi"])
        if key in found:
            continue
        namespace, _, name = proc["pod"].partition("/")
        record = cluster.pods.get((namespace, name))
        containers = (record.obj.get("spec") or {}).get("containers") or [] if record else []
        container = containers[0].get("name", "") if containers else ""
        found[key] = [("container", container), ("namespace", namespace), ("pod", name), ("pod_uid", proc["pod_uid"])]
    return found


def _entities(cluster: Cluster, node: Node) -> list[_Line]:
    pods = _pods(cluster, node)
    used_by_unit: dict[tuple[int, int | None], int] = {}
    for proc in scheduler.processes(cluster, node):
        used_by_unit[(proc["gpu"], proc["gi"])] = used_by_unit.get((proc["gpu"], proc["gi"]), 0) + proc["used_bytes"]
    driver_version = cluster.settings.driver_version
    lines: list[_Line] = []
    for gpu in node.gpus:
        if gpu.lost:
            continue
        head = [
            ("gpu", gpu.index),
            ("UUID", gpu.uuid),
            ("pci_bus_id", gpu.pci_bus_id),
            ("device", f"nvidia{gpu.index}"),
            ("modelName", gpu.product.model_name),
        ]
        tail = [("Hostname", node.name), ("DCGM_FI_DRIVER_VERSION", driver_version)]
        device = _device_values(node, gpu)
        if not gpu.mig_enabled:
            used_gpu = sum(b for (g, _), b in used_by_unit.items() if g == gpu.index) // 2**20
            values = {**device, **_unit_values(gpu.product.memory_mib, used_gpu + gpu_reserved_mib(gpu), gpu.activity)}
            lines.append(_Line(head + tail, values, pods.get((gpu.index, None), [])))
            continue
        shared = {name: value for name, value in device.items() if _scope(name) == DEVICE}
        for gi_id in sorted(gpu.instances):
            gi: GpuInstance = gpu.instances[gi_id]
            used = used_by_unit.get((gpu.index, gi.id), 0) // 2**20 + reserved_mib(gpu.product, gi.profile)
            values = {**shared, **_unit_values(gi.profile.memory_mib, used, gi.activity)}
            mig = [("GPU_I_PROFILE", gi.profile.name), ("GPU_I_ID", gi.id)]
            lines.append(_Line(head + mig + tail, values, pods.get((gpu.index, gi.id), [])))
    return lines


def _scope(name: str) -> str:
    return next(f.scope for f in FIELDS if f.name == name)


def render(cluster: Cluster, node: Node) -> str:
    """The exporter's /metrics text for `node` (call with the state lock held)."""
    entities = _entities(cluster, node)
    out: list[str] = []
    for field in FIELDS:
        rows = [e for e in entities if field.name in e.values]
        if not rows:
            continue
        out.append(f"# HELP {field.name} {field.help}")
        out.append(f"# TYPE {field.name} {field.type}")
        for entity in rows:
            value = entity.values[field.name]
            extra = list(entity.pod)
            if field.name == "DCGM_FI_DEV_XID_ERRORS":
                extra += [("err_code", value), ("err_msg", _XID_MESSAGES.get(int(value), f"XID {int(value)}"))]
            out.append(f"{field.name}{{{_labels(entity.labels + extra)}}} {_format(value)}")
    return "\n".join(out) + "\n"


def metrics(state, cluster_name: str | None, node_name: str) -> str:
    """The /metrics text of one node's exporter; driver.NodeGone if the node is not in the cluster."""
    with state.lock:
        cluster = state.cluster(cluster_name)
        node = cluster.nodes.get(node_name)
        if node is None:
            raise NodeGone(f"node {node_name!r} not found in cluster {cluster.name!r}")
        return render(cluster, node)
