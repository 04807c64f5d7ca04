"""A read-only probe of this host's GPUs for `manage.py gpu-probe`: what NVML says, as plain data.

It reads what discovery (inventory.gpu_info) and monitoring (metrics.read_gpu_counters) read, plus
the board figures a person checks against the catalog (clocks in MHz, performance state, power
limits in W, BAR1 in MiB, MIG device attributes). It calls no NVML setter, creates nothing and
registers no event set; unavailable values are None and refusals (NO_PERMISSION) are warnings.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pynvml

from .inventory import _cuda_version, gpu_info, privilege_warning
from .metrics import GpuMetrics, read_gpu_counters, read_mig_metrics
from .sessions import MIB, GpuLost, NvmlError, NvmlSession, as_text, is_nvml_error, session


def _mhz(s: NvmlSession, call: str, handle: Any, clock: int) -> int | None:
    value = s.optional(call, handle, clock)
    return None if value is None else int(value)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else int(milliwatts) / 1000.0


def _board(s: NvmlSession, handle: Any) -> dict:
    """Clocks, performance state, power limits and BAR1 of one physical GPU."""
    constraints = s.optional("nvmlDeviceGetPowerManagementLimitConstraints", handle)
    bar1 = s.optional("nvmlDeviceGetBAR1MemoryInfo", handle)
    capability = s.optional("nvmlDeviceGetCudaComputeCapability", handle)
    pstate = s.optional("nvmlDeviceGetPerformanceState", handle)
    return {
        "compute_capability": None if capability is None else f"{capability[0]}.{capability[1]}",
        "clocks_mhz": {
            "sm": _mhz(s, "nvmlDeviceGetClockInfo", handle, pynvml.NVML_CLOCK_SM),
            "sm_max": _mhz(s, "nvmlDeviceGetMaxClockInfo", handle, pynvml.NVML_CLOCK_SM),
            "memory": _mhz(s, "nvmlDeviceGetClockInfo", handle, pynvml.NVML_CLOCK_MEM),
            "memory_max": _mhz(s, "nvmlDeviceGetMaxClockInfo", handle, pynvml.NVML_CLOCK_MEM),
        },
        "performance_state": None if pstate is None else f"P{int(pstate)}",
        "power_limit_w": {
            "enforced": _watts(s.optional("nvmlDeviceGetEnforcedPowerLimit", handle)),
            "default": _watts(s.optional("nvmlDeviceGetPowerManagementDefaultLimit", handle)),
            "min": None if constraints is None else _watts(constraints[0]),
            "max": None if constraints is None else _watts(constraints[1]),
        },
        "bar1_mib": None if bar1 is None else {"total": bar1.bar1Total // MIB, "used": bar1.bar1Used // MIB},
    }


def _mig_attributes(s: NvmlSession, handle: Any) -> dict[str, dict]:
    """MIG device UUID -> its name and attributes (multiprocessors, slices, memory), readable without root."""
    found = {}
    for i in range(int(s.optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0)):
        mig = s.optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is None:
            continue
        attrs = s.optional("nvmlDeviceGetAttributes", mig)
        found[as_text(s.call("nvmlDeviceGetUUID", mig)) or ""] = {
            "name": as_text(s.optional("nvmlDeviceGetName", mig)),
            "multiprocessors": None if attrs is None else int(attrs.multiprocessorCount),
            "gpu_instance_slices": None if attrs is None else int(attrs.gpuInstanceSliceCount),
            "compute_instance_slices": None if attrs is None else int(attrs.computeInstanceSliceCount),
            "memory_size_mb": None if attrs is None else int(attrs.memorySizeMB),
        }
    return found


def _gpu(s: NvmlSession, index: int) -> dict:
    info = gpu_info(s, index)
    out = asdict(info)
    out["lost"] = info.lost
    if info.lost:
        return out
    try:
        handle = s.call("nvmlDeviceGetHandleByIndex", index)
        out.update(_board(s, handle))
        metrics = GpuMetrics(index=index, uuid=info.uuid, mig_enabled=info.mig_current)
        read_gpu_counters(s, handle, metrics)
        if info.mig_current:
            metrics.mig = read_mig_metrics(s, handle)
            attributes = _mig_attributes(s, handle)
            for device in out["mig_devices"]:
                device.update(attributes.get(device["uuid"], {}))
        readings = asdict(metrics)
        for key in ("index", "uuid", "lost", "error", "mig_enabled", "processes", "xids"):
            readings.pop(key)
        out["metrics"] = readings
    except GpuLost as exc:
        out.update(health="lost", lost=True, error=f"GPU is lost ({exc})")
    except Exception as exc:
        if not is_nvml_error(exc):
            raise
        out["error"] = out["error"] or f"NVML error while reading GPU {index}: {exc}"
    return out


def probe(api_url: str = "", node_name: str = "") -> dict:
    """One read of every GPU on this host (or a simulated node): identity, MIG devices, board figures, metrics.

    NvmlError when NVML cannot start (no driver: NVML_ERROR_LIBRARY_NOT_FOUND / DRIVER_NOT_LOADED).
    """
    with session(api_url, node_name) as s:
        try:
            count = int(s.call("nvmlDeviceGetCount"))
        except Exception as exc:
            if is_nvml_error(exc) or isinstance(exc, GpuLost):
                raise NvmlError(f"nvmlDeviceGetCount failed: {exc}") from None
            raise
        result = {
            "driver_version": as_text(s.optional("nvmlSystemGetDriverVersion")) or "",
            "nvml_version": as_text(s.optional("nvmlSystemGetNVMLVersion")) or "",
            "cuda_version": _cuda_version(s.optional("nvmlSystemGetCudaDriverVersion")),
            "gpus": [_gpu(s, i) for i in range(count)],
        }
        result["warnings"] = [g["error"] for g in result["gpus"] if g["error"] and not g["lost"]]
        if s.denied:
            result["warnings"].insert(0, privilege_warning(s.denied))
        return result
