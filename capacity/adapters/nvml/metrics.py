"""Metric readings for the monitoring app (monitoring/services/collect.py): one poll of every GPU of a node.

Unavailable (NotSupported, NotFound, NoData, FunctionNotFound) is None, never zero.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml

from .inventory import ProcessInfo, read_process_utilization, read_processes
from .sessions import (
    UNAVAILABLE,
    GpuLost,
    NvmlSession,
    as_text,
    error_code,
    is_nvml_error,
    mib,
    node_errors,
    session,
)
from .vgpu import VgpuMetrics, read_vgpus

logger = logging.getLogger(__name__)

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
    vgpus: list[VgpuMetrics] = field(default_factory=list)  # a vm-vgpu host's vGPUs on this GPU (nvml.vgpu)


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
                if not (is_nvml_error(exc) and error_code(exc) in UNAVAILABLE):
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
                if is_nvml_error(exc) and error_code(exc) == pynvml.NVML_ERROR_TIMEOUT:
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
            if is_nvml_error(exc):
                logger.info("XID events unavailable on %s: %s", node_name, exc)
                return None
            raise
        _xid_watchers[key] = watcher
    return watcher


def forget_xid_watchers() -> None:
    """Drop the per-node event sets (tests; a node agent never needs this)."""
    _xid_watchers.clear()


def read_gpu_counters(s: NvmlSession, handle: Any, m: GpuMetrics) -> None:
    power = s.optional("nvmlDeviceGetPowerUsage", handle)
    m.power_w = None if power is None else int(power) / 1000.0
    energy = s.optional("nvmlDeviceGetTotalEnergyConsumption", handle)
    m.energy_mj = None if energy is None else int(energy)
    temperature = s.optional("nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)
    m.temperature_c = None if temperature is None else int(temperature)
    memory = s.optional("nvmlDeviceGetMemoryInfo", handle)
    if memory is not None:
        m.memory_used_mib, m.memory_total_mib = mib(memory.used), mib(memory.total)
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


def read_mig_metrics(s: NvmlSession, handle: Any) -> list[MigMetrics]:
    count = s.optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    devices = []
    for i in range(int(count)):
        mig = s.optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is None:
            continue
        memory = s.optional("nvmlDeviceGetMemoryInfo", mig)
        devices.append(
            MigMetrics(
                uuid=as_text(s.call("nvmlDeviceGetUUID", mig)) or "",
                gpu_instance_id=int(s.call("nvmlDeviceGetGpuInstanceId", mig)),
                memory_used_mib=None if memory is None else mib(memory.used),
                memory_total_mib=None if memory is None else mib(memory.total),
                processes=read_processes(s, mig),
            )
        )
    return devices


def node_metrics(api_url: str, node_name: str, *, gpm_interval_s: float = 0.15) -> list[GpuMetrics]:
    """One poll of every GPU of a node: counters, MIG instances, GPM SM activity, XID events, processes.

    GPM needs two samples more than 100 ms apart: the first samples of every GPU and GPU instance are
    taken, then one sleep of `gpm_interval_s`, then the second samples; every sample is freed.
    A GPU lost at any step is reported `lost=True` with nothing else. NvmlError if NVML cannot start.
    """
    with session(api_url, node_name) as s:
        with node_errors(node_name):
            count = int(s.call("nvmlDeviceGetCount"))
        watcher = _xid_watcher(api_url, node_name, s.lib)
        gpus: list[GpuMetrics] = []
        gpm: list[tuple[GpuMetrics, MigMetrics | None, Any, int | None, Any]] = []
        try:
            for index in range(count):
                m = GpuMetrics(index=index)
                gpus.append(m)
                try:
                    handle = s.call("nvmlDeviceGetHandleByIndex", index)
                    m.uuid = as_text(s.call("nvmlDeviceGetUUID", handle))
                    mode = s.optional("nvmlDeviceGetMigMode", handle)
                    m.mig_enabled = bool(mode is not None and mode[0])
                    read_gpu_counters(s, handle, m)
                    if m.mig_enabled:
                        m.mig = read_mig_metrics(s, handle)
                    else:
                        m.processes = read_processes(s, handle)
                        read_process_utilization(s, handle, m.processes)
                        m.vgpus = read_vgpus(s, handle)
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
    m.mig, m.processes, m.xids, m.vgpus = [], [], None, []
