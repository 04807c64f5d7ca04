"""The fake NVML as unkind as a real driver: privileges, the calls beyond the basics, real units (#14 item 4)."""

from __future__ import annotations

import pynvml
import pytest

from simcluster import library_for_state
from simcluster.nvml import PRIVILEGED_SYMBOLS

NODE = "prod-h100-bal-01"  # 8 x H100 80GB HBM3, MIG balanced


@pytest.fixture
def nvml(state):
    def build(*, privileged: bool = True):
        lib = library_for_state(state, "prod", NODE, privileged=privileged)
        lib.nvmlInit()
        opened.append(lib)
        return lib

    opened = []
    yield build
    for lib in opened:
        lib.nvmlShutdown()


def test_an_unprivileged_agent_is_refused_gpu_instance_queries_but_reads_the_rest(nvml):
    lib = nvml(privileged=False)
    gpu = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NoPermission) as denied:
        lib.nvmlDeviceGetGpuInstanceById(gpu, 1)
    assert str(denied.value) == "Insufficient Permissions"
    with pytest.raises(pynvml.NVMLError_NoPermission):
        instances, count = (pynvml.c_nvmlGpuInstance_t * 7)(), pynvml.c_uint(7)
        lib.nvmlDeviceGetGpuInstances(gpu, 19, instances, pynvml.byref(count))
    with pytest.raises(pynvml.NVMLError_NoPermission):
        lib.nvmlDeviceCreateGpuInstance(gpu, 19)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        lib.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_DISABLE)
    # What nvidia-smi -L shows a non-root user still works: MIG device handles, their ids and memory.
    mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert lib.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert lib.nvmlDeviceGetGpuInstanceId(mig) >= 0
    assert lib.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount in (1, 2, 3, 4, 7)
    assert lib.nvmlDeviceGetName(gpu) == "NVIDIA H100 80GB HBM3"


def test_the_kind_world_keeps_the_privileged_calls(nvml):
    lib = nvml()
    gpu = lib.nvmlDeviceGetHandleByIndex(0)
    mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    gi = lib.nvmlDeviceGetGpuInstanceById(gpu, lib.nvmlDeviceGetGpuInstanceId(mig))
    assert lib.nvmlGpuInstanceGetInfo(gi).placement.size in (1, 2, 4, 8)
    assert "nvmlDeviceGetGpuInstanceProfileInfo" not in PRIVILEGED_SYMBOLS  # a catalog read, open to all


def test_clocks_power_limits_bar1_and_pstate_answer_in_real_units(nvml):
    lib = nvml()
    gpu = lib.nvmlDeviceGetHandleByIndex(0)
    assert lib.nvmlDeviceGetMaxClockInfo(gpu, pynvml.NVML_CLOCK_SM) == 1980  # MHz
    assert lib.nvmlDeviceGetMaxClockInfo(gpu, pynvml.NVML_CLOCK_MEM) == 2619
    assert 0 < lib.nvmlDeviceGetClockInfo(gpu, pynvml.NVML_CLOCK_SM) <= 1980
    assert lib.nvmlDeviceGetPerformanceState(gpu) == pynvml.NVML_PSTATE_0
    assert lib.nvmlDeviceGetPowerManagementLimitConstraints(gpu) == [200_000, 700_000]  # mW
    assert lib.nvmlDeviceGetPowerManagementDefaultLimit(gpu) == 700_000
    bar1 = lib.nvmlDeviceGetBAR1MemoryInfo(gpu)
    assert bar1.bar1Total == 128 * 1024**3 and bar1.bar1Used + bar1.bar1Free == bar1.bar1Total  # bytes
    mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # device-level readings are not per MIG device
        lib.nvmlDeviceGetClockInfo(mig, pynvml.NVML_CLOCK_SM)


def test_field_values_agree_with_the_direct_calls_and_refuse_unknown_fields(nvml):
    lib = nvml()
    gpu = lib.nvmlDeviceGetHandleByIndex(0)
    energy, power, sbe, unknown = lib.nvmlDeviceGetFieldValues(
        gpu,
        [
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            pynvml.NVML_FI_DEV_POWER_INSTANT,
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
            pynvml.NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL,
        ],
    )
    assert (energy.nvmlReturn, energy.valueType) == (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
    assert energy.value.ullVal == lib.nvmlDeviceGetTotalEnergyConsumption(gpu)  # mJ
    assert power.value.uiVal == lib.nvmlDeviceGetPowerUsage(gpu)  # mW
    assert sbe.value.ullVal == lib.nvmlDeviceGetTotalEccErrors(
        gpu, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
    )
    assert unknown.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_a_symbol_the_simulation_lacks_is_function_not_found_not_not_found(nvml):
    lib = nvml()
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        lib.nvmlDeviceGetVbiosVersion(lib.nvmlDeviceGetHandleByIndex(0))
