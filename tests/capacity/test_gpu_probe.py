"""`manage.py gpu-probe` (#14): a read-only JSON probe through the NVML adapter, compared with the simulator's model."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

NODE = "prod-h100-bal-01"  # 8 x H100 80GB HBM3, MIG balanced


def probe(*args) -> dict:
    out = StringIO()
    call_command("gpu-probe", *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.fixture
def sim(simcluster):
    return simcluster("demo")


def test_the_probe_of_a_simulated_h100_node_matches_the_simulator_s_model_and_changes_nothing(sim):
    node = sim.state.cluster("prod").nodes[NODE]
    before = [(g.mig_current, sorted((i.id, i.profile.name, i.start) for i in g.instances.values())) for g in node.gpus]

    found = probe("--api-url", sim.url("prod"), "--node", NODE)

    assert found["warnings"] == [] and found["driver_version"] and found["cuda_version"]
    assert [g["uuid"] for g in found["gpus"]] == [g.uuid for g in node.gpus]
    for real, gpu in zip(node.gpus, found["gpus"], strict=True):
        product = real.product
        assert (gpu["name"], gpu["memory_mib"], gpu["mig_current"]) == (product.model_name, product.memory_mib, True)
        assert gpu["compute_capability"] == "9.0" and gpu["performance_state"] == "P0"
        assert gpu["power_limit_w"]["enforced"] == gpu["power_limit_w"]["max"] == product.power_limit_w == 700
        assert gpu["clocks_mhz"]["sm_max"] == 1980 and gpu["bar1_mib"]["total"] == 131072
        assert gpu["metrics"]["power_w"] == pytest.approx(real.power_w, abs=0.001)
        assert gpu["metrics"]["gpu_util"] is None  # NotSupported on a MIG-enabled GPU, as on real hardware
        expected = {
            ci.uuid: (gi.profile.profile_id, gi.start, gi.profile.memory_slices, gi.profile.multiprocessors)
            for gi, ci in real.mig_devices()
        }
        assert {
            d["uuid"]: (d["profile_id"], d["placement_start"], d["placement_size"], d["multiprocessors"])
            for d in gpu["mig_devices"]
        } == expected
        assert {d["memory_mib"] for d in gpu["mig_devices"]} <= {p.memory_mib for p in product.profiles}
    after = [(g.mig_current, sorted((i.id, i.profile.name, i.start) for i in g.instances.values())) for g in node.gpus]
    assert after == before


def test_an_unprivileged_probe_still_reports_and_says_which_privilege_is_missing(sim, settings):
    settings.NVML_LIBRARY = "simcluster.nvml.unprivileged_library_for_node"
    found = probe("--api-url", sim.url("prod"), "--node", NODE)
    assert "nvmlDeviceGetGpuInstanceById (NVML_ERROR_NO_PERMISSION)" in found["warnings"][0]
    assert all(d["placement_start"] is None and d["multiprocessors"] for g in found["gpus"] for d in g["mig_devices"])


def test_without_a_driver_the_probe_exits_with_a_clear_message(settings):
    settings.NVML_LIBRARY = "capacity.adapters.nvml.local_pynvml"  # the real pynvml; this host has no driver
    with pytest.raises(CommandError, match=r"No usable NVIDIA driver: nvmlInit on this host failed: NVML Shared "):
        probe()
