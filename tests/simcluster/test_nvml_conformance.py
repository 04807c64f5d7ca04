"""The fake NVML has pynvml's interface: names, signatures, structs, errors, and a simulated C
symbol behind every function gpuaas relies on."""

from __future__ import annotations

import inspect
import re
import types

import pynvml
import pytest

from simcluster import library_for_state
from simcluster.nvml import SimulatedLibrary

# The functions the brief and the adapters rely on.
REQUIRED = """
nvmlInit nvmlShutdown nvmlSystemGetDriverVersion nvmlSystemGetCudaDriverVersion nvmlDeviceGetCount
nvmlDeviceGetHandleByIndex nvmlDeviceGetHandleByUUID nvmlDeviceGetHandleByPciBusId nvmlDeviceGetName nvmlDeviceGetUUID
nvmlDeviceGetSerial nvmlDeviceGetPciInfo nvmlDeviceGetIndex nvmlDeviceGetMemoryInfo nvmlDeviceGetMigMode
nvmlDeviceSetMigMode nvmlDeviceGetGpuInstanceProfileInfo nvmlDeviceGetGpuInstancePossiblePlacements
nvmlDeviceGetGpuInstanceRemainingCapacity nvmlDeviceCreateGpuInstanceWithPlacement nvmlDeviceCreateGpuInstance
nvmlDeviceGetGpuInstances nvmlDeviceGetGpuInstanceById nvmlGpuInstanceGetInfo
nvmlGpuInstanceGetComputeInstanceProfileInfo
nvmlGpuInstanceCreateComputeInstance nvmlGpuInstanceGetComputeInstances nvmlComputeInstanceGetInfo
nvmlComputeInstanceDestroy nvmlGpuInstanceDestroy nvmlDeviceGetMaxMigDeviceCount nvmlDeviceGetMigDeviceHandleByIndex
nvmlDeviceIsMigDeviceHandle nvmlDeviceGetDeviceHandleFromMigDeviceHandle nvmlDeviceGetGpuInstanceId
nvmlDeviceGetComputeInstanceId nvmlDeviceGetAttributes nvmlDeviceGetPowerUsage nvmlDeviceGetTotalEnergyConsumption
nvmlDeviceGetTemperature nvmlDeviceGetUtilizationRates nvmlDeviceGetTotalEccErrors nvmlDeviceGetEccMode
nvmlDeviceGetRemappedRows nvmlDeviceGetRetiredPages nvmlDeviceGetCurrentClocksEventReasons
nvmlDeviceGetCurrentClocksThrottleReasons nvmlDeviceGetComputeRunningProcesses nvmlGpmQueryDeviceSupport
nvmlGpmSampleAlloc nvmlGpmSampleFree nvmlGpmSampleGet nvmlGpmMigSampleGet nvmlGpmMetricsGet nvmlEventSetCreate
nvmlDeviceRegisterEvents nvmlEventSetWait_v2 nvmlEventSetWait nvmlEventSetFree nvmlDeviceGetSupportedEventTypes
nvmlDeviceGetArchitecture nvmlDeviceGetCudaComputeCapability nvmlDeviceGetEnforcedPowerLimit nvmlDeviceGetMinorNumber
nvmlGpuInstanceCreateComputeInstanceWithPlacement nvmlGpuInstanceGetComputeInstanceById
nvmlGpuInstanceGetComputeInstanceRemainingCapacity nvmlSystemGetNVMLVersion nvmlDeviceGetPowerManagementLimit
nvmlDeviceGetNvLinkState nvmlDeviceGetP2PStatus
""".split()

_SYMBOL = re.compile(r'_nvmlGetFunctionPointer\("(\w+)"\)')
_CALLS = re.compile(r"\b(nvml\w+)\(")


def c_symbols(name: str, seen: set[str] | None = None) -> set[str]:
    """The libnvidia-ml symbols a pynvml function needs, following calls to other wrappers."""
    seen = seen if seen is not None else set()
    if name in seen:
        return set()
    seen.add(name)
    fn = inspect.unwrap(getattr(pynvml, name))
    source = inspect.getsource(fn)
    symbols = set(_SYMBOL.findall(source))
    for callee in set(_CALLS.findall(source)) - {name}:
        if callable(getattr(pynvml, callee, None)) and callee not in symbols:
            symbols |= c_symbols(callee, seen)
    return symbols


@pytest.fixture
def fake(state):
    return library_for_state(state, "prod", "prod-h100-bal-01")


def test_every_fake_function_matches_pynvml_by_name_and_signature(fake):
    functions = {n: f for n, f in vars(fake).items() if n.startswith("nvml") and isinstance(f, types.FunctionType)}
    assert len(functions) > 400
    for name, fn in functions.items():
        original = getattr(pynvml, name, None)
        assert original is not None, name
        assert inspect.signature(fn) == inspect.signature(original), name
        assert list(inspect.signature(fn).parameters) == list(inspect.signature(original).parameters), name


@pytest.mark.parametrize("name", REQUIRED)
def test_required_functions_are_backed_by_simulated_symbols(fake, name):
    assert callable(getattr(fake, name))
    missing = c_symbols(name) - SimulatedLibrary.symbols()
    assert not missing, f"{name} needs {sorted(missing)}"


def test_errors_constants_and_structs_are_pynvml_s_own(fake):
    assert fake.NVMLError is pynvml.NVMLError
    assert fake.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert fake.c_nvmlGpuInstancePlacement_t is pynvml.c_nvmlGpuInstancePlacement_t
    assert fake.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t
    assert fake.NVML_ERROR_INSUFFICIENT_RESOURCES == 23
    assert fake.nvmlClocksEventReasonHwThermalSlowdown == pynvml.nvmlClocksEventReasonHwThermalSlowdown


def test_unsimulated_symbols_fail_like_an_old_driver(fake):
    fake.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            fake.nvmlDeviceGetVbiosVersion(fake.nvmlDeviceGetHandleByIndex(0))
    finally:
        fake.nvmlShutdown()


def test_return_types_match_pynvml(fake):
    fake.nvmlInit()
    try:
        handle = fake.nvmlDeviceGetHandleByIndex(0)
        assert isinstance(handle, pynvml.c_nvmlDevice_t)
        assert isinstance(fake.nvmlDeviceGetName(handle), str)
        assert isinstance(fake.nvmlDeviceGetUUID(handle), str)
        assert isinstance(fake.nvmlSystemGetDriverVersion(), str)
        pci = fake.nvmlDeviceGetPciInfo(handle)
        assert isinstance(pci, pynvml.nvmlPciInfo_t)
        # pynvml 13.615.71's _PrintableStructure decodes char arrays on attribute access: str, not bytes.
        assert pci.busId == "00000000:18:00.0" and pci.busIdLegacy == "0000:18:00.0"
        assert bytes(pci)[:12] == b"0000:18:00.0"  # the raw struct holds bytes, as the C library wrote them
        assert isinstance(fake.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
        assert isinstance(fake.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t)
        assert isinstance(fake.nvmlDeviceGetMigMode(handle), list)
        mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
        is_mig = fake.nvmlDeviceIsMigDeviceHandle(mig)
        assert isinstance(is_mig, pynvml.c_uint) and is_mig.value == 1
        assert isinstance(fake.nvmlDeviceGetAttributes(mig), pynvml.c_nvmlDeviceAttributes)
        assert isinstance(fake.nvmlDeviceGetRemappedRows(handle), tuple)
        procs = fake.nvmlDeviceGetComputeRunningProcesses(handle)
        assert all(isinstance(p, pynvml.nvmlFriendlyObject) for p in procs)
    finally:
        fake.nvmlShutdown()
