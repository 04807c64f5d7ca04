"""The fake NVML against the same state the API server shows."""

from __future__ import annotations

import re
from ctypes import byref, c_uint

import pynvml
import pytest

from simcluster import Scenario, library_for_node, library_for_state, load_scenario
from simcluster.scheduler import assigned_devices

UUID = re.compile(r"^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture
def nvml(state):
    """NVML of prod-h100-bal-01 (8 x H100, all-balanced, team-vision/detector on a 1g)."""
    lib = library_for_state(state, "prod", "prod-h100-bal-01")
    lib.nvmlInit()
    yield lib
    lib.nvmlShutdown()


def full_nvml(state, node="prod-h100-full-02"):
    lib = library_for_state(state, "prod", node)
    lib.nvmlInit()
    return lib


def test_uninitialised_calls_fail(state):
    lib = library_for_state(state, "prod", "prod-h100-bal-01")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    lib.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib.nvmlDeviceGetName(handle)


def test_identity(nvml, state):
    node = state.cluster("prod").nodes["prod-h100-bal-01"]
    assert nvml.nvmlDeviceGetCount() == 8
    assert nvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 12040
    handle = nvml.nvmlDeviceGetHandleByIndex(3)
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    uuid = nvml.nvmlDeviceGetUUID(handle)
    assert UUID.match(uuid) and uuid == node.gpu(3).uuid
    assert re.fullmatch(r"\d{13}", nvml.nvmlDeviceGetSerial(handle))
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(uuid)) == 3
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    assert (pci.busId, pci.pciDeviceId, pci.bus) == ("00000000:5D:00.0", 0x233010DE, 0x5D)
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByPciBusId("00000000:5D:00.0")) == 3
    assert nvml.nvmlDeviceGetCudaComputeCapability(handle) == (9, 0)
    assert nvml.nvmlDeviceGetArchitecture(handle) == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 81559 * 1024 * 1024
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


def test_mig_devices_match_the_device_plugin(nvml, state):
    node = state.cluster("prod").nodes["prod-h100-bal-01"]
    seen = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]
        assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
        for m in range(7):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, m)
            except pynvml.NVMLError_NotFound:
                break
            assert nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig).contents is not None
            assert nvml.nvmlDeviceGetUUID(
                nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            ) == nvml.nvmlDeviceGetUUID(handle)
            gi_id = nvml.nvmlDeviceGetGpuInstanceId(mig)
            seen.append((nvml.nvmlDeviceGetUUID(mig), nvml.nvmlDeviceGetName(mig), gi_id))
    devices = node.devices
    assert sorted(u for u, _, _ in seen) == sorted(
        devices["nvidia.com/mig-1g.10gb"] + devices["nvidia.com/mig-2g.20gb"] + devices["nvidia.com/mig-3g.40gb"]
    )
    # all-balanced on one GPU, by GI id: 3g (GI 1), 2g at start 2 (GI 3+1), 1g at starts 0 and 1 (GI 7, 8).
    assert [(name.split(" MIG ")[1], gi) for _, name, gi in seen[:4]] == [
        ("3g.40gb", 1),
        ("2g.20gb", 4),
        ("1g.10gb", 7),
        ("1g.10gb", 8),
    ]


def test_profile_info_and_placements_follow_the_reference(nvml):
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    expected = {  # profile id: (starts, size) - reference §1.3
        19: ([0, 1, 2, 3, 4, 5, 6], 1),
        20: ([0, 1, 2, 3, 4, 5, 6], 1),
        15: ([0, 2, 4, 6], 2),
        14: ([0, 2, 4], 2),
        9: ([0, 4], 4),
        5: ([0], 4),
        0: ([0], 8),
    }
    for profile_id, (starts, size) in expected.items():
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
        count = c_uint(0)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, placements, byref(count))
        assert [(placements[i].start, placements[i].size) for i in range(count.value)] == [(s, size) for s in starts]
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
    assert (info.id, info.sliceCount, info.memorySizeMB, info.multiprocessorCount, info.name) == (
        15,
        1,
        20096,
        26,
        "MIG 1g.20gb",
    )
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 19) == 0  # all-balanced leaves slice 7 only


def test_create_gpu_instance_at_placement_appears_in_allocatable(state, prod):
    lib = full_nvml(state)
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # MIG is off
        lib.nvmlDeviceCreateGpuInstance(handle, 9)
    assert lib.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    node = prod.read_node("prod-h100-full-02")
    assert node.status.allocatable["nvidia.com/gpu"] == "7"  # the MIG-enabled GPU left the full-GPU pool
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 4, 4
    gi = lib.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, byref(placement))
    info = lib.nvmlGpuInstanceGetInfo(gi)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) in {(1, 9, 4, 4), (2, 9, 4, 4)}
    assert "nvidia.com/mig-3g.40gb" not in prod.read_node("prod-h100-full-02").status.allocatable  # no CI yet
    ci = lib.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    ci_info = lib.nvmlComputeInstanceGetInfo(ci)
    assert (ci_info.id, ci_info.profileId, ci_info.placement.size) == (0, 2, 3)
    node = prod.read_node("prod-h100-full-02")
    assert node.status.allocatable["nvidia.com/mig-3g.40gb"] == "1"
    assert node.metadata.labels["nvidia.com/mig-3g.40gb.count"] == "1"
    mig_uuid = lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0))
    assert state.cluster("prod").nodes["prod-h100-full-02"].devices["nvidia.com/mig-3g.40gb"] == [mig_uuid]
    # Overlap, bad start, destroy order.
    other = pynvml.c_nvmlGpuInstancePlacement_t()
    other.start, other.size = 4, 2
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        lib.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 14, byref(other))
    other.start = 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 14, byref(other))
    with pytest.raises(pynvml.NVMLError_InUse):
        lib.nvmlGpuInstanceDestroy(gi)
    lib.nvmlComputeInstanceDestroy(ci)
    lib.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # the handle is stale now
        lib.nvmlGpuInstanceGetInfo(gi)
    assert prod.read_node("prod-h100-full-02").status.allocatable["nvidia.com/mig-3g.40gb"] == "0"
    lib.nvmlShutdown()


def test_default_placement_order_is_the_observed_one(state):
    lib = full_nvml(state)
    handle = lib.nvmlDeviceGetHandleByIndex(1)
    lib.nvmlDeviceSetMigMode(handle, 1)
    ids = [lib.nvmlGpuInstanceGetInfo(lib.nvmlDeviceCreateGpuInstance(handle, 19)).id for _ in range(7)]
    assert ids == [13, 11, 12, 7, 8, 9, 10]  # starts 6,4,5,0,1,2,3 (reference §1.6)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        lib.nvmlDeviceCreateGpuInstance(handle, 19)
    gis = (pynvml.c_nvmlGpuInstance_t * 7)()
    count = c_uint(0)
    lib.nvmlDeviceGetGpuInstances(handle, 19, gis, byref(count))
    assert count.value == 7
    assert lib.nvmlGpuInstanceGetInfo(lib.nvmlDeviceGetGpuInstanceById(handle, 12)).placement.start == 5
    lib.nvmlShutdown()


def test_gpu_busy_with_pods_refuses_changes(nvml, state):
    node = state.cluster("prod").nodes["prod-h100-bal-01"]
    (busy_uuid,) = assigned_devices(state.cluster("prod"), "team-vision", "detector")
    index = next(g.index for g in node.gpus for _, ci in g.mig_devices() if ci.uuid == busy_uuid)
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    mig = nvml.nvmlDeviceGetHandleByUUID(busy_uuid)
    gi = nvml.nvmlDeviceGetGpuInstanceById(handle, nvml.nvmlDeviceGetGpuInstanceId(mig))
    cis = (pynvml.c_nvmlComputeInstance_t * 1)()
    count = c_uint(0)
    nvml.nvmlGpuInstanceGetComputeInstances(gi, 0, cis, byref(count))
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(cis[0])
    with pytest.raises(pynvml.NVMLError_InUse):  # MIG instances exist
        nvml.nvmlDeviceSetMigMode(handle, 0)


def test_set_mig_mode_on_a_busy_gpu_stays_pending(state):
    lib = full_nvml(state, "prod-h100-full-01")  # llm-train pods hold GPUs here
    node = state.cluster("prod").nodes["prod-h100-full-01"]
    busy = {d for d in node.assigned}
    index = next(g.index for g in node.gpus if g.uuid in busy)
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    assert lib.nvmlDeviceSetMigMode(handle, 1) == pynvml.NVML_ERROR_IN_USE
    assert lib.nvmlDeviceGetMigMode(handle) == [0, 1]
    lib.nvmlShutdown()


def test_processes_and_pod_mapping(nvml, state):
    (detector_uuid,) = assigned_devices(state.cluster("prod"), "team-vision", "detector")
    mig = nvml.nvmlDeviceGetHandleByUUID(detector_uuid)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(mig)
    assert len(procs) == 1
    proc = procs[0]
    assert proc.gpuInstanceId == nvml.nvmlDeviceGetGpuInstanceId(mig)
    assert proc.computeInstanceId == 0
    assert 0 < proc.usedGpuMemory <= 9984 * 1024 * 1024
    detector = state.cluster("prod").pods[("team-vision", "detector")].obj
    assert nvml.pod_uid_for_pid(proc.pid) == detector["metadata"]["uid"]
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(parent)] == [proc.pid]
    other = nvml.nvmlDeviceGetHandleByIndex(7 if nvml.nvmlDeviceGetIndex(parent) != 7 else 6)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(other) == []
    full = full_nvml(state, "prod-h100-full-01")
    procs = [p for i in range(8) for p in full.nvmlDeviceGetComputeRunningProcesses(full.nvmlDeviceGetHandleByIndex(i))]
    assert len(procs) == 4 and {p.gpuInstanceId for p in procs} == {0xFFFFFFFF}


def test_telemetry_moves_with_ticks(state):
    lib = full_nvml(state)
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    power = lib.nvmlDeviceGetPowerUsage(handle)
    energy = lib.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert 70_000 <= power <= 700_000
    assert lib.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
    util = lib.nvmlDeviceGetUtilizationRates(handle)
    assert 0 <= util.gpu <= 100
    state.tick(60.0)
    later = lib.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert later - energy == pytest.approx(lib.nvmlDeviceGetPowerUsage(handle) * 60, rel=0.01)
    assert 20 <= lib.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) <= 100
    assert lib.nvmlDeviceGetEccMode(handle) == [1, 1]
    assert lib.nvmlDeviceGetTotalEccErrors(handle, 1, 0) == 0
    assert lib.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        lib.nvmlDeviceGetRetiredPages(handle, 1)
    lib.nvmlShutdown()


def test_utilisation_not_supported_on_mig(nvml):
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(handle)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(mig)
    assert nvml.nvmlDeviceGetMemoryInfo(mig).total == 40448 * 1024 * 1024


def gpm(lib, handle, metric, gi=None, between=None):
    first, second = lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()
    try:
        for sample in (first, second):
            if gi is None:
                lib.nvmlGpmSampleGet(handle, sample)
            else:
                lib.nvmlGpmMigSampleGet(handle, gi, sample)
            if between and sample is first:
                between()
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = metric
        lib.nvmlGpmMetricsGet(request)
        return request.metrics[0].nvmlReturn, request.metrics[0].value
    finally:
        lib.nvmlGpmSampleFree(first)
        lib.nvmlGpmSampleFree(second)


def test_gpm_per_device_and_per_mig_instance_on_hopper(nvml, state):
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
    ret, device_sm = gpm(nvml, handle, pynvml.NVML_GPM_METRIC_SM_UTIL, between=lambda: state.tick(1.0))
    assert ret == pynvml.NVML_SUCCESS and 0.0 <= device_sm <= 100.0
    values = {}
    for gi_id in (1, 4, 7, 8):
        ret, values[gi_id] = gpm(nvml, handle, pynvml.NVML_GPM_METRIC_SM_UTIL, gi=gi_id)
        assert ret == pynvml.NVML_SUCCESS
    gpu = state.cluster("prod").nodes["prod-h100-bal-01"].gpu(0)
    assert values == {gi.id: pytest.approx(gi.activity * 100, abs=0.01) for gi in gpu.instances.values()}
    assert values[1] * 3 / 7 + values[4] * 2 / 7 + values[7] / 7 + values[8] / 7 == pytest.approx(
        gpu.activity * 100, abs=0.05
    )


def test_activity_follows_the_work_placed_on_each_unit():
    from django.conf import settings

    from simcluster.scheduler import unit_work

    state = load_scenario("demo").build()
    state.tick(30.0)
    idle_pct = settings.MONITORING_IDLE_SM_PCT
    with_work, without = [], []
    for cluster in state.clusters.values():
        for node in cluster.nodes.values():
            work = unit_work(cluster, node)
            for gpu in node.gpus:
                on_gpu = work.get(gpu.index, {})
                if gpu.mig_enabled:
                    for gi in gpu.instances.values():
                        (with_work if gi.id in on_gpu else without).append((on_gpu.get(gi.id), 100 * gi.activity))
                else:
                    (with_work if None in on_gpu else without).append((on_gpu.get(None), 100 * gpu.activity))
                if not on_gpu:  # nothing runs on the GPU: a recorded idle board's power (docs/simcluster.md)
                    assert gpu.power_w == {"H100-80GB": 100.89, "H200-141GB": 74.58}[gpu.product.key]
    assert {character for character, _ in with_work} == {"training", "inference", "development"}
    assert len(without) > 100
    assert max(pct for _, pct in without) == 0  # nothing runs: an idle GPU reads 0 % SM
    assert min(pct for _, pct in with_work) > idle_pct
    training = [pct for character, pct in with_work if character == "training"]
    inference = [pct for character, pct in with_work if character == "inference"]
    assert min(training) > 70 and max(inference) < 75


def test_gpm_not_supported_on_ampere():
    state = Scenario.from_dict(
        {
            "name": "t",
            "clusters": [
                {"name": "c", "node_groups": [{"name_prefix": "a100", "product": "A100-80GB", "gpus_per_node": 1}]}
            ],
        }
    ).build()
    lib = library_for_state(state, "c", "a100-01")
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    assert lib.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 0
    sample = lib.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        lib.nvmlGpmSampleGet(handle, sample)
    assert lib.nvmlDeviceGetArchitecture(handle) == pynvml.NVML_DEVICE_ARCH_AMPERE
    lib.nvmlShutdown()


# --- faults seen through NVML --------------------------------------------------------------


def test_lost_gpu(state, prod):
    lib = full_nvml(state)
    before = prod.read_node("prod-h100-full-02")
    state.faults.gpu_lost("prod", "prod-h100-full-02", 2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        lib.nvmlDeviceGetHandleByIndex(2)
    assert lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByIndex(3)) == "NVIDIA H100 80GB HBM3"
    after = prod.read_node("prod-h100-full-02")
    assert after.status.allocatable["nvidia.com/gpu"] == "7"
    assert after.status.capacity["nvidia.com/gpu"] == "8"
    assert after.metadata.labels["nvidia.com/gpu.count"] == before.metadata.labels["nvidia.com/gpu.count"] == "8"
    state.faults.reset()
    assert lib.nvmlDeviceGetIndex(lib.nvmlDeviceGetHandleByIndex(2)) == 2
    assert prod.read_node("prod-h100-full-02").status.allocatable["nvidia.com/gpu"] == "8"
    lib.nvmlShutdown()


def test_xid_and_ecc_events(state):
    lib = full_nvml(state)
    events = lib.nvmlEventSetCreate()
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert lib.nvmlDeviceGetSupportedEventTypes(handles[0]) & pynvml.nvmlEventTypeXidCriticalError
    for h in handles:
        lib.nvmlDeviceRegisterEvents(
            h, pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError, events
        )
    with pytest.raises(pynvml.NVMLError_Timeout):
        lib.nvmlEventSetWait_v2(events, 10)
    state.faults.xid("prod", "prod-h100-full-02", 5, code=48)
    state.faults.ecc_double_bit("prod", "prod-h100-full-02", 1, count=2)
    data = lib.nvmlEventSetWait_v2(events, 1000)
    assert (data.eventType, data.eventData, data.gpuInstanceId) == (
        pynvml.nvmlEventTypeXidCriticalError,
        48,
        0xFFFFFFFF,
    )
    assert lib.nvmlDeviceGetIndex(data.device) == 5
    data = lib.nvmlEventSetWait(events, 1000)
    assert data.eventType == pynvml.nvmlEventTypeDoubleBitEccError
    assert (
        lib.nvmlDeviceGetTotalEccErrors(handles[1], pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        == 2
    )
    state.faults.row_remap_pending("prod", "prod-h100-full-02", 1)
    assert lib.nvmlDeviceGetRemappedRows(handles[1]) == (0, 1, 1, 0)
    state.faults.thermal_throttle("prod", "prod-h100-full-02", 1)
    reasons = lib.nvmlDeviceGetCurrentClocksEventReasons(handles[1])
    assert reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert reasons & pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert lib.nvmlDeviceGetCurrentClocksThrottleReasons(handles[1]) == reasons
    lib.nvmlEventSetFree(events)
    lib.nvmlShutdown()


def test_library_for_node_uses_the_in_process_server(server, state):
    lib = library_for_node(server.cluster_url("dev"), "dev-h200-ts-01")
    assert lib is library_for_node(server.cluster_url("dev"), "dev-h200-ts-01")
    lib.nvmlInit()
    assert lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA H200"
    assert lib.nvmlSystemGetDriverVersion() == "550.90.07"
    lib.nvmlShutdown()
    missing = library_for_node(server.cluster_url("dev"), "no-such-node")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        missing.nvmlInit()


def test_per_process_sm_utilisation_on_whole_gpus(nvml, state):
    full = full_nvml(state, "prod-h100-full-01")
    handles = [full.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    running = {p.pid for h in handles for p in full.nvmlDeviceGetComputeRunningProcesses(h)}
    samples = []
    for handle in handles:
        try:
            samples += full.nvmlDeviceGetProcessUtilization(handle, 0)
        except pynvml.NVMLError_NotFound:  # an idle GPU has no sample, as on hardware
            continue
    assert {s.pid for s in samples} == running
    assert all(0 <= s.smUtil <= 100 for s in samples)
    (detector_uuid,) = assigned_devices(state.cluster("prod"), "team-vision", "detector")
    mig = nvml.nvmlDeviceGetHandleByUUID(detector_uuid)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetProcessUtilization(mig, 0)


def test_nvlink_state_and_p2p_status_follow_the_board():
    """HGX H100 (SXM): 18 links per GPU, all GPUs joined through NVSwitch; H100 NVL: bridged pairs, 12 links."""
    state = Scenario.from_dict(
        {
            "name": "t",
            "clusters": [
                {
                    "name": "c",
                    "node_groups": [
                        {"name_prefix": "hgx", "product": "H100-80GB", "gpus_per_node": 8},
                        {"name_prefix": "nvl", "product": "H100-94GB-NVL", "gpus_per_node": 4},
                    ],
                }
            ],
        }
    ).build()
    nvlink = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    hgx = library_for_state(state, "c", "hgx-01")
    hgx.nvmlInit()
    h = [hgx.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert hgx.nvmlDeviceGetNvLinkState(h[0], 17) == pynvml.NVML_FEATURE_ENABLED
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        hgx.nvmlDeviceGetNvLinkState(h[0], 18)
    assert hgx.nvmlDeviceGetP2PStatus(h[0], h[7], nvlink) == pynvml.NVML_P2P_STATUS_OK
    with state.lock:
        state.cluster("c").nodes["hgx-01"].gpus[7].nvlink_down = True
    hgx.nvmlShutdown()
    hgx.nvmlInit()
    h = [hgx.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert hgx.nvmlDeviceGetNvLinkState(h[7], 0) == pynvml.NVML_FEATURE_DISABLED
    assert hgx.nvmlDeviceGetP2PStatus(h[0], h[7], nvlink) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    hgx.nvmlShutdown()

    nvl = library_for_state(state, "c", "nvl-01")
    nvl.nvmlInit()
    h = [nvl.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvl.nvmlDeviceGetNvLinkState(h[0], 12)
    assert nvl.nvmlDeviceGetP2PStatus(h[0], h[1], nvlink) == pynvml.NVML_P2P_STATUS_OK
    assert nvl.nvmlDeviceGetP2PStatus(h[1], h[2], nvlink) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    assert nvl.nvmlDeviceGetP2PStatus(h[2], h[3], nvlink) == pynvml.NVML_P2P_STATUS_OK
    nvl.nvmlShutdown()
