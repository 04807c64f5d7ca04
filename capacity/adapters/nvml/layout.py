"""MIG layout writes for the reconfiguration workflow (node-agent backend): a GPU holds exactly a set of instances."""

from __future__ import annotations

import re
from ctypes import byref, c_uint
from typing import Any

import pynvml

from capacity.mig.catalog import CI_PROFILE_BY_SLICES

from .sessions import UNAVAILABLE, GpuLost, NvmlSession, error_code, is_nvml_error


class LayoutError(Exception):
    """NVML refused a MIG change (Insufficient Resources, In Use, a pending mode change ...)."""


def _nvml_struct(s: NvmlSession, name: str):
    return getattr(s.lib, name, None) or getattr(pynvml, name)


def _gpu_instances(s: NvmlSession, handle: Any, profile_ids) -> list[tuple[Any, int, int, int]]:
    """Every GPU instance of the GPU as (handle, profile id, placement start, GI id)."""
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
    found = []
    ci_type = _nvml_struct(s, "c_nvmlComputeInstance_t")
    for slices, ci_profile in CI_PROFILE_BY_SLICES.items():
        handles = (ci_type * 8)()
        count = c_uint(0)
        try:
            s.call("nvmlGpuInstanceGetComputeInstances", gi, ci_profile, handles, byref(count))
        except Exception as exc:
            if is_nvml_error(exc) and error_code(exc) in UNAVAILABLE:
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
        if is_nvml_error(exc):
            raise LayoutError(f"{what}: {_error_name(exc)}") from None
        raise
    return done


def _error_name(exc: BaseException) -> str:
    """ "Insufficient Resources (NVML error 23)" from NVMLError_InsufficientResources, whatever str() says."""
    name = type(exc).__name__.removeprefix("NVMLError_")
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name) if name != "NVMLError" else str(exc)
    return f"{words} (NVML error {error_code(exc)})"
