"""The simulated libnvidia-ml's vGPU host calls (vm-vgpu nodes): active vGPUs, their type and its framebuffer, the
mdev UUID, the VM id, framebuffer in use and per-vGPU utilisation (SM, memory, encoder, decoder), as pynvml calls
them (nvmlDeviceGetActiveVgpus, nvmlVgpuInstanceGetType, nvmlVgpuTypeGetName, nvmlVgpuTypeGetFramebufferSize,
nvmlVgpuInstanceGetMdevUUID, nvmlVgpuInstanceGetVmID, nvmlVgpuInstanceGetFbUsage, nvmlDeviceGetVgpuUtilization;
nvml.h, NVML API Reference "vGPU Management" and nvmlVgpuInstanceUtilizationSample_t). A mixin of
simcluster.nvml.SimulatedLibrary, which answers from the node snapshot (simcluster.driver: `gpus[].vgpus`).
"""

from __future__ import annotations

import pynvml

from capacity.vgpu import VGPU_TYPES

from .nvml_abi import _c_call, _int, _out_array, _Return, _set, _target, _write_string

_VGPU_TYPE_IDS = {name: i + 1 for i, name in enumerate(sorted(VGPU_TYPES))}


def _vgpu_id(gpu: dict, vgpu: dict) -> int:
    return 1000 * gpu["index"] + int(vgpu["mdev"].rsplit("-", 1)[1]) + 1


class VgpuCalls:
    """The vGPU host entry points. Instance ids are 1000 * GPU index + vGPU number + 1; type ids the catalog's
    sorted position + 1; a type's name is the mdev type name, "NVIDIA <type>" (what kubevirt-gpu-device-plugin
    turns into its resource name). A vGPU's VM id is of type NVML_VGPU_VM_ID_UUID (KVM hosts: the libvirt
    domain's UUID); here the VM's virt-launcher pod, `<namespace>/<pod>`, stands in for it."""

    def _vgpu(self, instance) -> dict:
        wanted = _int(instance)
        for gpu in self._current()["snap"]["gpus"]:
            for vgpu in gpu.get("vgpus", ()):
                if _vgpu_id(gpu, vgpu) == wanted:
                    return vgpu
        raise _Return(pynvml.NVML_ERROR_NOT_FOUND)

    @_c_call
    def nvmlDeviceGetActiveVgpus(self, handle, count, instances):
        gpu = self._full_gpu(handle)
        vgpus = gpu.get("vgpus", [])
        if instances is None:
            _set(count, len(vgpus))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if vgpus else None
        out = _out_array(instances, len(vgpus))
        for i, vgpu in enumerate(vgpus):
            out[i] = _vgpu_id(gpu, vgpu)
        _set(count, len(vgpus))

    @_c_call
    def nvmlVgpuInstanceGetType(self, instance, ref):
        _set(ref, _VGPU_TYPE_IDS.get(self._vgpu(instance)["type"], 0))

    @_c_call
    def nvmlVgpuTypeGetName(self, type_id, buf, size):
        names = {v: k for k, v in _VGPU_TYPE_IDS.items()}
        name = names.get(_int(type_id))
        if name is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _write_string(buf, _target(size), f"NVIDIA {name}")

    @_c_call
    def nvmlVgpuInstanceGetMdevUUID(self, instance, buf, size):
        _write_string(_target(buf), size, self._vgpu(instance)["mdev"])  # pynvml passes byref(buffer)

    @_c_call
    def nvmlVgpuTypeGetFramebufferSize(self, type_id, ref):
        names = {v: k for k, v in _VGPU_TYPE_IDS.items()}
        name = names.get(_int(type_id))
        if name is None:
            raise _Return(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _set(ref, VGPU_TYPES[name].framebuffer_gb * 1024**3)

    @_c_call
    def nvmlVgpuInstanceGetVmID(self, instance, buf, size, id_type):
        _write_string(_target(buf), size, self._vgpu(instance).get("vm", ""))
        _set(id_type, pynvml.NVML_VGPU_VM_ID_UUID)

    @_c_call
    def nvmlVgpuInstanceGetFbUsage(self, instance, ref):
        _set(ref, self._vgpu(instance)["fb_used_bytes"])

    @_c_call
    def nvmlDeviceGetVgpuUtilization(self, handle, last_seen, value_type, count, samples):
        gpu = self._full_gpu(handle)
        vgpus = gpu.get("vgpus", [])
        _set(value_type, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
        if samples is None:
            _set(count, len(vgpus))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if vgpus else None
        out = _out_array(samples, len(vgpus))
        for i, vgpu in enumerate(vgpus):
            out[i].vgpuInstance = _vgpu_id(gpu, vgpu)
            out[i].timeStamp = int(self._current()["snap"]["time"] * 1_000_000)
            out[i].smUtil.uiVal = int(vgpu["sm_util"])
            out[i].memUtil.uiVal = int(vgpu["sm_util"] * 55 // 100)
            out[i].encUtil.uiVal = int(vgpu.get("enc_util", 0))
            out[i].decUtil.uiVal = int(vgpu.get("dec_util", 0))
        _set(count, len(vgpus))
