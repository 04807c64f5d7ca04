"""vGPU host reads (a vm-vgpu node, NVIDIA vGPU manager loaded): which vGPUs run on each GPU and how busy each is.

NVML's vGPU management calls, as pynvml binds them: nvmlDeviceGetActiveVgpus (the GPU's vGPU instances),
nvmlVgpuInstanceGetType + nvmlVgpuTypeGetName (the type, "NVIDIA H100XM-20C"), nvmlVgpuInstanceGetMdevUUID (the
mdev UUID: the device id kubevirt-gpu-device-plugin hands the VM, so a reading joins the VM's workload row),
nvmlVgpuInstanceGetFbUsage (framebuffer used, bytes), nvmlVgpuTypeGetFramebufferSize (the type's framebuffer),
nvmlVgpuInstanceGetVmID (the VM's id and its kind: a domain UUID on KVM, NVML_VGPU_VM_ID_UUID) and
nvmlDeviceGetVgpuUtilization (per-vGPU SM, frame-buffer memory, encoder and decoder utilisation, percent:
nvmlVgpuInstanceUtilizationSample_t in NVIDIA's NVML API Reference, "vGPU Structs"). On a GPU without the vGPU
manager the calls answer NotSupported: no readings, never zeros. Not read here: licence state
(nvmlVgpuInstanceGetLicenseStatus), per-process utilisation inside VMs (nvmlDeviceGetVgpuProcessUtilization:
the guest's processes, which the host side can name but gpuaas does not attribute), the guest's own view.

The node agent reads these with its metrics poll (nvml.metrics.node_metrics: GpuMetrics.vgpus); monitoring stores
one series per vGPU (monitoring.services.collect).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .sessions import NvmlSession, as_text, session

TYPE_NAME_PREFIXES = ("NVIDIA ", "GRID ")


@dataclass(slots=True)
class VgpuMetrics:
    gpu_uuid: str
    mdev_uuid: str
    vgpu_type: str  # the catalog name, "H100XM-20C"
    sm_util_pct: int | None
    memory_util_pct: int | None
    fb_used_mib: int | None
    enc_util_pct: int | None = None
    dec_util_pct: int | None = None
    fb_total_mib: int | None = None  # the type's framebuffer
    vm_id: str = ""  # NVML's VM id (KVM: the domain UUID)


def _type_name(raw: str | None) -> str:
    name = raw or ""
    for prefix in TYPE_NAME_PREFIXES:
        name = name.removeprefix(prefix)
    return name


def read_vgpus(s: NvmlSession, handle: Any) -> list[VgpuMetrics]:
    """The GPU's active vGPUs with their latest utilisation sample; [] where NVML offers no vGPU calls."""
    instances = s.optional("nvmlDeviceGetActiveVgpus", handle) or []
    if not instances:
        return []
    samples = {int(x.vgpuInstance): x for x in s.optional("nvmlDeviceGetVgpuUtilization", handle, 0) or []}
    gpu_uuid = as_text(s.call("nvmlDeviceGetUUID", handle)) or ""
    result = []
    for instance in instances:
        type_id = s.optional("nvmlVgpuInstanceGetType", instance)
        fb = s.optional("nvmlVgpuInstanceGetFbUsage", instance)
        fb_total = s.optional("nvmlVgpuTypeGetFramebufferSize", type_id) if type_id else None
        vm = s.optional("nvmlVgpuInstanceGetVmID", instance)
        sample = samples.get(int(getattr(instance, "value", instance)))
        result.append(
            VgpuMetrics(
                gpu_uuid=gpu_uuid,
                mdev_uuid=as_text(s.optional("nvmlVgpuInstanceGetMdevUUID", instance)) or "",
                vgpu_type=_type_name(as_text(s.optional("nvmlVgpuTypeGetName", type_id)) if type_id else ""),
                sm_util_pct=None if sample is None else int(sample.smUtil.uiVal),
                memory_util_pct=None if sample is None else int(sample.memUtil.uiVal),
                fb_used_mib=None if fb is None else int(fb) // (1024 * 1024),
                enc_util_pct=None if sample is None else int(sample.encUtil.uiVal),
                dec_util_pct=None if sample is None else int(sample.decUtil.uiVal),
                fb_total_mib=None if fb_total is None else int(fb_total) // (1024 * 1024),
                vm_id=(as_text(vm[0]) or "") if vm else "",
            )
        )
    return result


def node_vgpus(api_url: str = "", node_name: str = "") -> list[VgpuMetrics]:
    """Every GPU's vGPUs on one node (one NVML session)."""
    with session(api_url, node_name) as s:
        count = int(s.call("nvmlDeviceGetCount"))
        return [v for i in range(count) for v in read_vgpus(s, s.call("nvmlDeviceGetHandleByIndex", i))]
