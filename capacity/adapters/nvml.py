"""The NVML adapter: what a node agent reads from the GPUs of its own node.

The library is not imported directly: settings.NVML_LIBRARY names a factory
`(api_url, node_name) -> pynvml-compatible object`. On real GPU nodes that is
`capacity.adapters.nvml.local_pynvml` (the real `pynvml` module, talking to the local driver);
under the simulator it is the simulator's fake NVML for that node. Both raise pynvml's
`NVMLError_*` classes, which this module turns into plain values:

- NotSupported (and NotFound/NoData for optional facts) -> the value is unavailable (None);
- GpuIsLost -> the GPU is reported with health "lost" and nothing else about it is trusted.

Everything is returned as plain dataclasses; nothing outside this module touches NVML handles.
Use `session()` (nvmlInit/nvmlShutdown around the block) for anything that reads a node.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pynvml
from django.conf import settings
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

# NVML return codes (nvml.h); compared by value so a fake library's own error classes work too.
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
NO_DATA = pynvml.NVML_ERROR_NO_DATA
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_UNAVAILABLE = frozenset({NOT_SUPPORTED, NOT_FOUND, NO_DATA, FUNCTION_NOT_FOUND})

HEALTH_OK = "ok"
HEALTH_LOST = "lost"
_MIB = 1024 * 1024


class NvmlError(Exception):
    """NVML could not be loaded or initialised, or a node-wide read failed."""


class GpuLost(Exception):
    """Internal: the GPU fell off the bus (NVML_ERROR_GPU_IS_LOST) while being read."""


# --- Results --------------------------------------------------------------------------------


@dataclass(slots=True)
class ProcessInfo:
    pid: int
    used_memory_mib: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    pod_uid: str | None = None


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

    @property
    def lost(self) -> bool:
        return self.health == HEALTH_LOST


@dataclass(slots=True)
class NodeInventory:
    node_name: str
    driver_version: str = ""
    cuda_version: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)


# --- Loading the library --------------------------------------------------------------------


def local_pynvml(api_url: str = "", node_name: str = "") -> Any:
    """The factory for real GPU nodes: the `pynvml` module itself (libnvidia-ml.so.1 on this host)."""
    return pynvml


@cache
def _factory(path: str) -> Callable[[str, str], Any]:
    return import_string(path)


def load_library(api_url: str, node_name: str) -> Any:
    """The pynvml-compatible library for one node, from settings.NVML_LIBRARY."""
    try:
        factory = _factory(settings.NVML_LIBRARY)
    except ImportError as exc:
        raise NvmlError(f"NVML_LIBRARY={settings.NVML_LIBRARY!r} cannot be imported: {exc}") from None
    return factory(api_url, node_name)


def _code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def _is_nvml_error(exc: BaseException) -> bool:
    return isinstance(exc, pynvml.NVMLError) or type(exc).__name__.startswith("NVMLError")


class NvmlSession:
    """An initialised NVML library for one node. Read helpers translate errors into values."""

    def __init__(self, lib: Any, node_name: str = ""):
        self.lib = lib
        self.node_name = node_name

    def call(self, name: str, *args) -> Any:
        """lib.<name>(*args); GpuIsLost raises GpuLost, other NVML errors propagate."""
        try:
            return getattr(self.lib, name)(*args)
        except Exception as exc:
            if _is_nvml_error(exc) and _code(exc) == GPU_IS_LOST:
                raise GpuLost(name) from None
            raise

    def optional(self, name: str, *args) -> Any:
        """Like call(), but an unavailable value (NotSupported, NotFound, NoData) is None."""
        try:
            return self.call(name, *args)
        except GpuLost:
            raise
        except Exception as exc:
            if _is_nvml_error(exc) and _code(exc) in _UNAVAILABLE:
                return None
            raise

    def pod_uid_for_pid(self, pid: int) -> str | None:
        """The pod a process belongs to: the library's own answer (simulator), else /proc/<pid>/cgroup."""
        resolver = getattr(self.lib, "pod_uid_for_pid", None)
        if resolver is not None:
            return resolver(pid)
        if self.lib is pynvml:
            return pod_uid_from_cgroup(pid)
        return None


@contextmanager
def session(api_url: str = "", node_name: str = "") -> Iterator[NvmlSession]:
    """nvmlInit() ... nvmlShutdown() around the block; NvmlError if the library cannot start."""
    lib = load_library(api_url, node_name)
    try:
        lib.nvmlInit()
    except Exception as exc:
        if _is_nvml_error(exc):
            raise NvmlError(f"nvmlInit on {node_name or 'this host'} failed: {exc}") from None
        raise
    try:
        yield NvmlSession(lib, node_name)
    finally:
        try:
            lib.nvmlShutdown()
        except Exception as exc:  # a failed shutdown must not hide the block's own result
            logger.warning("nvmlShutdown on %s failed: %s", node_name, exc)


# --- Inventory ------------------------------------------------------------------------------


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def _cuda_version(raw: Any) -> str:
    """12040 -> "12.4" (nvmlSystemGetCudaDriverVersion returns major*1000 + minor*10)."""
    if raw is None:
        return ""
    raw = int(raw)
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _processes(s: NvmlSession, handle: Any) -> list[ProcessInfo]:
    procs = s.optional("nvmlDeviceGetComputeRunningProcesses", handle) or []
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        gi = getattr(p, "gpuInstanceId", None)
        ci = getattr(p, "computeInstanceId", None)
        out.append(
            ProcessInfo(
                pid=int(p.pid),
                used_memory_mib=None if used is None else int(used) // _MIB,
                gpu_instance_id=None if gi is None or gi == 0xFFFFFFFF else int(gi),
                compute_instance_id=None if ci is None or ci == 0xFFFFFFFF else int(ci),
                pod_uid=s.pod_uid_for_pid(int(p.pid)),
            )
        )
    return out


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
            gi = s.optional("nvmlDeviceGetGpuInstanceById", handle, gi_id)
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
                uuid=_text(s.call("nvmlDeviceGetUUID", mig)) or "",
                gpu_instance_id=gi_id,
                compute_instance_id=ci_id,
                profile_id=profile_id,
                placement_start=start,
                placement_size=size,
                memory_mib=None if memory is None else int(memory.total) // _MIB,
                processes=_processes(s, mig),
            )
        )
    return devices


def gpu_info(s: NvmlSession, index: int) -> GpuInfo:
    """One GPU by index; a GPU that is lost (at any step) comes back as GpuInfo(health="lost")."""
    gpu = GpuInfo(index=index, health=HEALTH_OK)
    try:
        handle = s.call("nvmlDeviceGetHandleByIndex", index)
        gpu.uuid = _text(s.call("nvmlDeviceGetUUID", handle))
        gpu.name = _text(s.optional("nvmlDeviceGetName", handle)) or ""
        gpu.serial = _text(s.optional("nvmlDeviceGetSerial", handle))
        pci = s.optional("nvmlDeviceGetPciInfo", handle)
        gpu.pci_bus_id = _text(pci.busId) if pci is not None else None
        memory = s.optional("nvmlDeviceGetMemoryInfo", handle)
        gpu.memory_mib = None if memory is None else int(memory.total) // _MIB
        mode = s.optional("nvmlDeviceGetMigMode", handle)
        if mode is not None:
            gpu.mig_current, gpu.mig_pending = bool(mode[0]), bool(mode[1])
        if gpu.mig_current:
            gpu.mig_devices = _mig_devices(s, handle)
        else:
            gpu.processes = _processes(s, handle)
    except GpuLost as exc:
        gpu.health = HEALTH_LOST
        gpu.error = f"GPU is lost ({exc})"
        gpu.mig_devices = []
        gpu.processes = []
    return gpu


def node_inventory(api_url: str, node_name: str) -> NodeInventory:
    """Everything discovery needs from one node's NVML: GPUs, MIG devices with placements, processes."""
    with session(api_url, node_name) as s:
        try:
            inventory = NodeInventory(
                node_name=node_name,
                driver_version=_text(s.optional("nvmlSystemGetDriverVersion")) or "",
                cuda_version=_cuda_version(s.optional("nvmlSystemGetCudaDriverVersion")),
            )
            count = int(s.call("nvmlDeviceGetCount"))
        except GpuLost as exc:
            raise NvmlError(f"{node_name}: {exc}") from None
        except Exception as exc:
            if _is_nvml_error(exc):
                raise NvmlError(f"{node_name}: {exc}") from None
            raise
        inventory.gpus = [gpu_info(s, i) for i in range(count)]
        return inventory


# --- Process -> pod ---------------------------------------------------------------------------

# kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice
# or cgroupfs: /kubepods/besteffort/pod<uid>/<container>
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def pod_uid_from_cgroup(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The pod UID in a process's cgroup path (the node agent needs hostPID), or None."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-") if match else None


# =================================================================================================
# MIG writes for the reconfiguration workflow's node-agent backend (capacity.services.reconfiguration).
# Appended as a separate block; nothing above is changed.
# =================================================================================================


class LayoutError(Exception):
    """NVML refused a MIG change (Insufficient Resources, In Use, a pending mode change ...)."""


def _nvml_struct(s: NvmlSession, name: str):
    return getattr(s.lib, name, None) or getattr(pynvml, name)


def _gpu_instances(s: NvmlSession, handle: Any, profile_ids) -> list[tuple[Any, int, int, int]]:
    """Every GPU instance of the GPU as (handle, profile id, placement start, GI id)."""
    from ctypes import byref, c_uint

    found = []
    gi_type = _nvml_struct(s, "c_nvmlGpuInstance_t")
    for profile_id in profile_ids:
        handles = (gi_type * 8)()
        count = c_uint(0)
        s.call("nvmlDeviceGetGpuInstances", handle, profile_id, handles, byref(count))
        for i in range(count.value):
            info = s.call("nvmlGpuInstanceGetInfo", handles[i])
            found.append((handles[i], int(info.profileId), int(info.placement.start), int(info.id)))
    return found


def _compute_instances(s: NvmlSession, gi: Any) -> list[tuple[Any, int]]:
    """Every compute instance of a GPU instance as (handle, compute slices)."""
    from ctypes import byref, c_uint

    from capacity.mig.catalog import CI_PROFILE_BY_SLICES

    found = []
    ci_type = _nvml_struct(s, "c_nvmlComputeInstance_t")
    for slices, ci_profile in CI_PROFILE_BY_SLICES.items():
        handles = (ci_type * 8)()
        count = c_uint(0)
        try:
            s.call("nvmlGpuInstanceGetComputeInstances", gi, ci_profile, handles, byref(count))
        except Exception as exc:
            if _is_nvml_error(exc) and _code(exc) in _UNAVAILABLE:
                continue  # that CI size does not exist in this GI
            raise
        found.extend((handles[i], slices) for i in range(count.value))
    return found


def _destroy_gi(s: NvmlSession, gi: Any) -> None:
    for ci, _ in _compute_instances(s, gi):
        s.call("nvmlComputeInstanceDestroy", ci)
    s.call("nvmlGpuInstanceDestroy", gi)


def apply_gpu_layout(s: NvmlSession, index: int, product, *, mig_enabled: bool, instances) -> dict[str, list[str]]:
    """Make GPU `index` (a catalog `product`) hold exactly `instances` [(Profile, start)], each with one full-size
    compute instance, or turn MIG off (mig_enabled=False). Re-entrant: instances already at their
    placement are kept (so allocated ones survive), others are destroyed, missing ones created, largest
    first. Raises LayoutError (naming the GPU and the operation) when NVML refuses.

    Returns {"destroyed": [...], "created": [...], "kept": [...]} as "profile@start" strings.
    """
    from ctypes import byref

    from capacity.mig.catalog import CI_PROFILE_BY_SLICES

    done: dict[str, list[str]] = {"destroyed": [], "created": [], "kept": []}
    what = f"GPU {index}"
    try:
        handle = s.call("nvmlDeviceGetHandleByIndex", index)
        current, _pending = s.call("nvmlDeviceGetMigMode", handle)
        profile_ids = sorted(p.profile_id for p in product.profiles)
        existing = sorted(_gpu_instances(s, handle, profile_ids), key=lambda gi: gi[2]) if current else []
        wanted = {(p.profile_id, start): p for p, start in instances}
        for gi, profile_id, start, gi_id in existing:
            if mig_enabled and (profile_id, start) in wanted:
                continue
            what = f"GPU {index}: destroying GPU instance {gi_id} (profile id {profile_id}) at {start}"
            _destroy_gi(s, gi)
            gone = product.by_id.get(profile_id)
            done["destroyed"].append(f"{gone.name if gone else profile_id}@{start}")
        if not mig_enabled:
            if current:
                what = f"GPU {index}: disabling MIG mode"
                status = s.call("nvmlDeviceSetMigMode", handle, 0)
                if status != pynvml.NVML_SUCCESS:
                    raise LayoutError(f"{what}: activation pending (status {status}); the GPU needs a reset")
            return done
        if not current:
            what = f"GPU {index}: enabling MIG mode"
            status = s.call("nvmlDeviceSetMigMode", handle, 1)
            if status != pynvml.NVML_SUCCESS:
                raise LayoutError(f"{what}: activation pending (status {status}); the GPU is busy or needs a reset")
        present = {(pid, start): gi for gi, pid, start, _ in existing if (pid, start) in wanted}
        placement_type = _nvml_struct(s, "c_nvmlGpuInstancePlacement_t")
        for (profile_id, start), profile in sorted(wanted.items(), key=lambda kv: (-kv[1].memory_slices, kv[0][1])):
            label = f"{profile.name}@{start}"
            gi = present.get((profile_id, start))
            if gi is None:
                what = f"GPU {index}: creating GPU instance {label}"
                placement = placement_type()
                placement.start, placement.size = start, profile.memory_slices
                gi = s.call("nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id, byref(placement))
                done["created"].append(label)
            else:
                done["kept"].append(label)
            cis = _compute_instances(s, gi)
            if not any(slices == profile.compute_slices for _, slices in cis):
                what = f"GPU {index}: creating the compute instance of {label}"
                for ci, _ in cis:
                    s.call("nvmlComputeInstanceDestroy", ci)
                s.call("nvmlGpuInstanceCreateComputeInstance", gi, CI_PROFILE_BY_SLICES[profile.compute_slices])
    except GpuLost:
        raise LayoutError(f"{what}: the GPU is lost") from None
    except LayoutError:
        raise
    except Exception as exc:
        if _is_nvml_error(exc):
            raise LayoutError(f"{what}: {_error_name(exc)}") from None
        raise
    return done


def _error_name(exc: BaseException) -> str:
    """ "Insufficient Resources (NVML error 23)" from NVMLError_InsufficientResources, whatever str() says."""
    name = type(exc).__name__.removeprefix("NVMLError_")
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name) if name != "NVMLError" else str(exc)
    return f"{words} (NVML error {_code(exc)})"


# =============================================================================================
# Metric readings for the monitoring app (monitoring/services/collect.py).
# Block owned by the monitoring engineer; it only adds functions and leaves the code above as is.
# Unavailable (NotSupported, NotFound, NoData, FunctionNotFound) is None, never zero.
# =============================================================================================

# Clock-event (throttle) reason bits, nvml.h nvmlClocksEventReason*.
THROTTLE_SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
THROTTLE_HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
THROTTLE_SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
THROTTLE_HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
THROTTLE_HW_POWER_BRAKE = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
_NO_INSTANCE = 0xFFFFFFFF


@dataclass(slots=True)
class XidEvent:
    """One XID critical-error event; gpu_instance_id when NVML attributes it to a MIG GPU instance."""

    code: int
    gpu_instance_id: int | None = None


@dataclass(slots=True)
class MigMetrics:
    """One MIG device (GI + CI): memory of the instance and SM activity of its GPU instance (GPM)."""

    uuid: str
    gpu_instance_id: int
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    sm_active: float | None = None  # percent, GPM SM_UTIL sampled on the parent with the GI id
    processes: list[ProcessInfo] = field(default_factory=list)


@dataclass(slots=True)
class GpuMetrics:
    """One poll of one physical GPU. `lost`: NVML answered GPU_IS_LOST; nothing else is trusted."""

    index: int
    uuid: str | None = None
    lost: bool = False
    error: str = ""
    mig_enabled: bool = False
    power_w: float | None = None
    energy_mj: int | None = None
    temperature_c: int | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    gpu_util: int | None = None
    sm_active: float | None = None
    ecc_sbe_vol: int | None = None
    ecc_dbe_vol: int | None = None
    ecc_sbe_agg: int | None = None
    ecc_dbe_agg: int | None = None
    retired_pages: int | None = None
    remap_corr: int | None = None
    remap_unc: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    throttle: int | None = None
    xids: list[XidEvent] | None = None  # None: XID events unavailable on this GPU
    mig: list[MigMetrics] = field(default_factory=list)
    processes: list[ProcessInfo] = field(default_factory=list)


class _XidWatcher:
    """A process-wide NVML event set per node, registered for XID critical errors on every GPU.

    NVML only delivers events that happen after registration, so the set outlives a poll: it
    holds its own nvmlInit reference (never shut down) and each poll drains what arrived since.
    """

    def __init__(self, lib: Any):
        self.lib = lib
        lib.nvmlInit()
        self.event_set = lib.nvmlEventSetCreate()
        self.registered: dict[int, bool] = {}  # GPU index -> XID events supported
        self.indexes: dict[int | None, int] = {}  # device handle address -> GPU index

    def register(self, s: NvmlSession, index: int, handle: Any) -> bool:
        if index not in self.registered:
            try:
                s.call("nvmlDeviceRegisterEvents", handle, pynvml.nvmlEventTypeXidCriticalError, self.event_set)
                self.registered[index] = True
                self.indexes[_handle_address(handle)] = index
            except GpuLost:
                raise
            except Exception as exc:
                if not (_is_nvml_error(exc) and _code(exc) in _UNAVAILABLE):
                    raise
                self.registered[index] = False
        return self.registered[index]

    def drain(self) -> dict[int, list[XidEvent]]:
        """Events queued since the last drain, by GPU index (also for a GPU lost since it registered)."""
        found: dict[int, list[XidEvent]] = {}
        for _ in range(1000):  # a storm of events must not stall the poll
            try:
                data = self.lib.nvmlEventSetWait(self.event_set, 0)
            except Exception as exc:
                if _is_nvml_error(exc) and _code(exc) == pynvml.NVML_ERROR_TIMEOUT:
                    break
                raise
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            index = self.indexes.get(_handle_address(data.device))
            if index is None:
                continue
            gi = int(data.gpuInstanceId)
            found.setdefault(index, []).append(
                XidEvent(code=int(data.eventData), gpu_instance_id=None if gi == _NO_INSTANCE else gi)
            )
        return found


_xid_watchers: dict[tuple[str, str], _XidWatcher] = {}


def _handle_address(handle: Any) -> int | None:
    import ctypes

    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


def _xid_watcher(api_url: str, node_name: str, lib: Any) -> _XidWatcher | None:
    key = (api_url, node_name)
    watcher = _xid_watchers.get(key)
    if watcher is None or watcher.lib is not lib:
        try:
            watcher = _XidWatcher(lib)
        except Exception as exc:
            if _is_nvml_error(exc):
                logger.info("XID events unavailable on %s: %s", node_name, exc)
                return None
            raise
        _xid_watchers[key] = watcher
    return watcher


def forget_xid_watchers() -> None:
    """Drop the per-node event sets (tests; a node agent never needs this)."""
    _xid_watchers.clear()


def _mib(value: Any) -> int | None:
    return None if value is None else int(value) // _MIB


def _read_gpu_counters(s: NvmlSession, handle: Any, m: GpuMetrics) -> None:
    power = s.optional("nvmlDeviceGetPowerUsage", handle)
    m.power_w = None if power is None else int(power) / 1000.0
    energy = s.optional("nvmlDeviceGetTotalEnergyConsumption", handle)
    m.energy_mj = None if energy is None else int(energy)
    temperature = s.optional("nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)
    m.temperature_c = None if temperature is None else int(temperature)
    memory = s.optional("nvmlDeviceGetMemoryInfo", handle)
    if memory is not None:
        m.memory_used_mib, m.memory_total_mib = _mib(memory.used), _mib(memory.total)
    utilisation = s.optional("nvmlDeviceGetUtilizationRates", handle)  # NotSupported on MIG-enabled GPUs
    m.gpu_util = None if utilisation is None else int(utilisation.gpu)
    ecc_enabled = s.optional("nvmlDeviceGetEccMode", handle)
    if ecc_enabled is not None and int(ecc_enabled[0]) == pynvml.NVML_FEATURE_ENABLED:
        counters = {
            "ecc_sbe_vol": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
            "ecc_dbe_vol": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
            "ecc_sbe_agg": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
            "ecc_dbe_agg": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        }
        for name, (error_type, counter_type) in counters.items():
            value = s.optional("nvmlDeviceGetTotalEccErrors", handle, error_type, counter_type)
            setattr(m, name, None if value is None else int(value))
    remapped = s.optional("nvmlDeviceGetRemappedRows", handle)
    if remapped is not None:
        m.remap_corr, m.remap_unc = int(remapped[0]), int(remapped[1])
        m.remap_pending, m.remap_failure = bool(remapped[2]), bool(remapped[3])
    else:  # pre-Ampere parts retire pages instead of remapping rows
        pages = [
            s.optional("nvmlDeviceGetRetiredPages", handle, cause)
            for cause in (
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERRORS,
            )
        ]
        m.retired_pages = None if any(p is None for p in pages) else sum(len(p) for p in pages)
    reasons = s.optional("nvmlDeviceGetCurrentClocksEventReasons", handle)
    m.throttle = None if reasons is None else int(reasons)


def _gpm_supported(s: NvmlSession, handle: Any) -> bool:
    support = s.optional("nvmlGpmQueryDeviceSupport", handle)
    return bool(support is not None and support.isSupportedDevice)


def _gpm_sample(s: NvmlSession, handle: Any, gi_id: int | None) -> Any | None:
    """A filled GPM sample of the GPU (gi_id None) or of one GPU instance; None when unavailable."""
    sample = s.optional("nvmlGpmSampleAlloc")
    if sample is None:
        return None
    try:
        if gi_id is None:
            done = s.optional("nvmlGpmSampleGet", handle, sample)
        else:
            done = s.optional("nvmlGpmMigSampleGet", handle, gi_id, sample)
    except Exception:
        _gpm_free(s, sample)
        raise
    if done is None:
        _gpm_free(s, sample)
        return None
    return sample


def _gpm_free(s: NvmlSession, sample: Any) -> None:
    try:
        s.lib.nvmlGpmSampleFree(sample)
    except Exception as exc:  # freeing must never hide the reading
        logger.debug("nvmlGpmSampleFree failed: %s", exc)


def _gpm_sm_util(s: NvmlSession, first: Any, second: Any) -> float | None:
    """SM_UTIL (percent) between two samples, or None if NVML does not give it."""
    struct = getattr(s.lib, "c_nvmlGpmMetricsGet_t", pynvml.c_nvmlGpmMetricsGet_t)
    request = struct()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1 = first
    request.sample2 = second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    if s.optional("nvmlGpmMetricsGet", request) is None:
        return None
    metric = request.metrics[0]
    if int(metric.nvmlReturn) != pynvml.NVML_SUCCESS:
        return None
    return max(0.0, min(100.0, float(metric.value)))


def _read_mig(s: NvmlSession, handle: Any) -> list[MigMetrics]:
    count = s.optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    devices = []
    for i in range(int(count)):
        mig = s.optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is None:
            continue
        memory = s.optional("nvmlDeviceGetMemoryInfo", mig)
        devices.append(
            MigMetrics(
                uuid=_text(s.call("nvmlDeviceGetUUID", mig)) or "",
                gpu_instance_id=int(s.call("nvmlDeviceGetGpuInstanceId", mig)),
                memory_used_mib=None if memory is None else _mib(memory.used),
                memory_total_mib=None if memory is None else _mib(memory.total),
                processes=_processes(s, mig),
            )
        )
    return devices


def node_metrics(api_url: str, node_name: str, *, gpm_interval_s: float = 0.15) -> list[GpuMetrics]:
    """One poll of every GPU of a node: counters, MIG instances, GPM SM activity, XID events, processes.

    GPM needs two samples more than 100 ms apart: the first samples of every GPU and GPU instance are
    taken, then one sleep of `gpm_interval_s`, then the second samples; every sample is freed.
    A GPU lost at any step is reported `lost=True` with nothing else. NvmlError if NVML cannot start.
    """
    import time

    with session(api_url, node_name) as s:
        try:
            count = int(s.call("nvmlDeviceGetCount"))
        except GpuLost as exc:
            raise NvmlError(f"{node_name}: {exc}") from None
        except Exception as exc:
            if _is_nvml_error(exc):
                raise NvmlError(f"{node_name}: {exc}") from None
            raise
        watcher = _xid_watcher(api_url, node_name, s.lib)
        gpus: list[GpuMetrics] = []
        gpm: list[tuple[GpuMetrics, MigMetrics | None, Any, int | None, Any]] = []
        try:
            for index in range(count):
                m = GpuMetrics(index=index)
                gpus.append(m)
                try:
                    handle = s.call("nvmlDeviceGetHandleByIndex", index)
                    m.uuid = _text(s.call("nvmlDeviceGetUUID", handle))
                    mode = s.optional("nvmlDeviceGetMigMode", handle)
                    m.mig_enabled = bool(mode is not None and mode[0])
                    _read_gpu_counters(s, handle, m)
                    if m.mig_enabled:
                        m.mig = _read_mig(s, handle)
                    else:
                        m.processes = _processes(s, handle)
                    if watcher is not None and watcher.register(s, index, handle):
                        m.xids = []
                    if _gpm_supported(s, handle):
                        units = [(None, None)] + [(mig, mig.gpu_instance_id) for mig in m.mig]
                        for mig, gi_id in units:
                            sample = _gpm_sample(s, handle, gi_id)
                            if sample is not None:
                                gpm.append((m, mig, handle, gi_id, sample))
                except GpuLost as exc:
                    _mark_lost(m, exc)
            if gpm:
                time.sleep(gpm_interval_s)
            for m, mig, handle, gi_id, first in gpm:
                if m.lost:
                    continue
                try:
                    second = _gpm_sample(s, handle, gi_id)
                    if second is None:
                        continue
                    try:
                        value = _gpm_sm_util(s, first, second)
                    finally:
                        _gpm_free(s, second)
                except GpuLost as exc:
                    _mark_lost(m, exc)
                    continue
                if mig is None:
                    m.sm_active = value
                else:
                    mig.sm_active = value
        finally:
            for *_, first in gpm:
                _gpm_free(s, first)
        if watcher is not None:
            for index, events in watcher.drain().items():
                if index < len(gpus):
                    gpus[index].xids = (gpus[index].xids or []) + events
        return gpus


def _mark_lost(m: GpuMetrics, exc: BaseException) -> None:
    m.lost = True
    m.error = f"GPU is lost ({exc})"
    m.mig, m.processes, m.xids = [], [], None
