"""The NVML adapter against the simulator's fake NVML: inventory, MIG placements, errors turned into values."""

import pynvml
import pytest

from capacity.adapters import nvml


@pytest.fixture
def sim(simcluster):
    return simcluster("demo")


def test_inventory_of_a_mig_node_matches_the_hardware(sim):
    inventory = nvml.node_inventory(sim.url("prod"), "prod-h100-bal-01")
    hardware = sim.state.cluster("prod").nodes["prod-h100-bal-01"]
    assert (inventory.driver_version, inventory.cuda_version) == ("550.54.15", "12.4")
    assert [g.index for g in inventory.gpus] == list(range(8))
    for gpu, real in zip(inventory.gpus, hardware.gpus, strict=True):
        assert (gpu.uuid, gpu.serial, gpu.pci_bus_id, gpu.name) == (real.uuid, real.serial, real.pci_bus_id, real.name)
        assert (gpu.memory_mib, gpu.mig_current, gpu.mig_pending, gpu.health) == (81559, True, True, "ok")
        assert [
            (d.uuid, d.gpu_instance_id, d.compute_instance_id, d.profile_id, d.placement_start, d.placement_size)
            for d in gpu.mig_devices
        ] == [
            (ci.uuid, gi.id, ci.id, gi.profile.profile_id, gi.start, gi.profile.memory_slices)
            for gi, ci in real.mig_devices()
        ]
    assert sorted(d.profile_id for d in inventory.gpus[0].mig_devices) == [9, 14, 19, 19]


def test_processes_of_pods_come_with_their_pod_uid(sim):
    inventory = nvml.node_inventory(sim.url("prod"), "prod-h100-full-01")
    pods = {(r.obj["metadata"]["name"], r.obj["metadata"]["uid"]) for r in sim.state.cluster("prod").pods.values()}
    uids = {uid: name for name, uid in pods}
    seen = [(uids.get(p.pod_uid), g.index) for g in inventory.gpus for p in g.processes]
    assert sorted(name for name, _ in seen) == ["llm-train-0", "llm-train-0", "llm-train-1", "llm-train-1"]
    assert all(p.pid > 0 and p.used_memory_mib is not None for g in inventory.gpus for p in g.processes)


def test_a_lost_gpu_is_reported_lost_and_the_others_are_read(sim):
    sim.faults.gpu_lost("prod", "prod-h100-full-02", 2)
    gpus = nvml.node_inventory(sim.url("prod"), "prod-h100-full-02").gpus
    assert [g.health for g in gpus] == ["ok", "ok", "lost", "ok", "ok", "ok", "ok", "ok"]
    assert (gpus[2].uuid, gpus[2].mig_devices, gpus[2].processes) == (None, [], [])
    assert "lost" in gpus[2].error


class FakeLibrary:
    """pynvml-shaped: NotSupported for the optional facts, a shutdown counter."""

    def __init__(self, fail_init=False):
        self.fail_init = fail_init
        self.shutdowns = 0

    def nvmlInit(self):  # noqa: N802 - NVML's names
        if self.fail_init:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):  # noqa: N802
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlSystemGetCudaDriverVersion(self):  # noqa: N802
        return 12040

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return "h0"

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return "GPU-1"

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return "NVIDIA L4"

    def __getattr__(self, name):  # everything else: not supported by this GPU
        def unsupported(*args):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        return unsupported


def test_not_supported_means_unavailable_and_the_session_always_shuts_down(settings, monkeypatch):
    library = FakeLibrary()
    monkeypatch.setattr(nvml.sessions, "load_library", lambda api_url, node: library)
    inventory = nvml.node_inventory("", "n1")
    (gpu,) = inventory.gpus
    assert (inventory.driver_version, inventory.cuda_version) == ("", "12.4")
    assert (gpu.uuid, gpu.name, gpu.serial, gpu.pci_bus_id, gpu.memory_mib) == ("GPU-1", "NVIDIA L4", None, None, None)
    assert (gpu.mig_current, gpu.mig_devices, gpu.processes, gpu.health) == (False, [], [], "ok")
    assert library.shutdowns == 1


def test_init_failures_and_bad_factories_are_nvml_errors(settings, monkeypatch):
    monkeypatch.setattr(nvml.sessions, "load_library", lambda api_url, node: FakeLibrary(fail_init=True))
    with pytest.raises(nvml.NvmlError, match="nvmlInit on n1 failed"):
        nvml.node_inventory("", "n1")
    monkeypatch.undo()
    settings.NVML_LIBRARY = "no.such.factory"
    with pytest.raises(nvml.NvmlError, match="NVML_LIBRARY='no.such.factory' cannot be imported"):
        nvml.load_library("", "n1")


def test_real_nodes_use_pynvml_itself(settings):
    settings.NVML_LIBRARY = "capacity.adapters.nvml.local_pynvml"
    assert nvml.load_library("https://ignored", "gpu-node-1") is pynvml


def test_pod_uid_from_a_process_cgroup(tmp_path):
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod1a2b3c4d_0000_4000_8000_00000000abcd.slice/cri-containerd-f00.scope\n"
    )
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/kubepods/burstable/pod1a2b3c4d-0000-4000-8000-00000000abce/f00\n")
    assert nvml.pod_uid_from_cgroup(41, tmp_path) == "1a2b3c4d-0000-4000-8000-00000000abcd"
    assert nvml.pod_uid_from_cgroup(42, tmp_path) == "1a2b3c4d-0000-4000-8000-00000000abce"
    assert nvml.pod_uid_from_cgroup(43, tmp_path) is None
