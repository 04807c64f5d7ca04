"""Reconfiguration against the GPU Operator as unkind as the real one (issue #14, items 2 and 3):
a device plugin that keeps its devices until its pod restarts, a MIG manager that reads a mounted
ConfigMap copy kubelet refreshes late and reboots to change the MIG mode."""

import time

import pytest
from reconfig_sim import answer_inventory_request, drive, node_row, start_sim

from operations import reconfiguration as rc
from operations.tasks import reconfiguration_step_task
from simcluster import gpuoperator

pytestmark = pytest.mark.django_db

SPLIT = {
    "0": [{"profile": "4g.40gb", "start": 0}, {"profile": "1g.10gb", "start": 4}, {"profile": "1g.20gb", "start": 6}]
}


def plugin_pod(sim, node: str) -> str:
    return sim.node(node).device_plugin_pod


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"], 1: ["7g.80gb"]}, "")])
    yield sim
    sim.server.stop()


def test_agent_path_restarts_the_device_plugin_and_waits_for_the_new_resources(sim):
    before = plugin_pod(sim, "gpu-a")
    reconf = rc.create(node_row("gpu-a"), SPLIT, backend="agent", force=True)

    drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert plugin_pod(sim, "gpu-a") != before
    assert sim.node("gpu-a").device_capacity == {
        "nvidia.com/mig-4g.40gb": 1,
        "nvidia.com/mig-1g.10gb": 1,
        "nvidia.com/mig-1g.20gb": 1,
        "nvidia.com/mig-7g.80gb": 1,
    }
    applied = reconf.steps.get(step="apply", event="completed")
    assert applied.detail["device_plugin"] == [before]


def test_agent_path_does_not_finish_while_the_old_resources_are_advertised(sim):
    with sim.state.lock:  # the DaemonSet will not bring the plugin back on this node
        sim.node("gpu-a").labels["nvidia.com/gpu.deploy.device-plugin"] = "false"
        sim.sim_cluster.touch(sim.node("gpu-a"))
    reconf = rc.create(node_row("gpu-a"), SPLIT, backend="agent", force=True)

    outcomes = drive(sim, reconf, max_calls=9)

    assert reconf.state == "waiting", outcomes
    assert outcomes[-3:] == ["verify:waiting"] * 3
    waiting = reconf.steps.filter(step="verify", event="waiting").latest("at")
    assert waiting.message == (
        "the device plugin still advertises the old instances (nvidia.com/mig-1g.10gb: 0 (expected 1), "
        "nvidia.com/mig-1g.20gb: 0 (expected 1), nvidia.com/mig-3g.40gb: 2 (expected 0), "
        "nvidia.com/mig-4g.40gb: 0 (expected 1)); waiting for it to re-register"
    )


def test_agent_change_survives_the_mig_manager_reapplying_the_label(sim):
    reconf = rc.create(node_row("gpu-a"), SPLIT, backend="agent", force=True)
    drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error

    node = sim.node("gpu-a")
    with sim.state.lock:  # a reboot: the manager applies the label's config from its mounted copy
        ok, message = gpuoperator.apply_mig_config(sim.sim_cluster, node, node.labels["nvidia.com/mig.config"])

    assert ok, message
    assert sim.layout("gpu-a", 0) == [("4g.40gb", 0), ("1g.10gb", 4), ("1g.20gb", 6)]
    assert sim.layout("gpu-a", 1) == [("7g.80gb", 0)]


def test_agent_path_leaves_the_label_alone_where_no_mig_manager_runs(sim):
    with sim.state.lock:
        sim.node("gpu-a").labels["nvidia.com/gpu.deploy.mig-manager"] = "false"
        sim.sim_cluster.touch(sim.node("gpu-a"))
    sim.discover()
    reconf = rc.create(node_row("gpu-a"), SPLIT, backend="agent", force=True)

    drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert "nvidia.com/mig.config" not in sim.node("gpu-a").labels
    assert reconf.config_name == ""


def drive_slowly(sim, reconf, *, pause: float, max_calls: int = 30) -> list[str]:
    """drive(), with the clock moving between calls and the MIG manager run on every waiting apply."""
    outcomes = []
    for _ in range(max_calls):
        reconf.refresh_from_db()
        if reconf.state in ("succeeded", "failed"):
            break
        outcome = reconfiguration_step_task(reconf.pk, reconf.step)
        outcomes.append(f"{reconf.step}:{outcome}")
        answer_inventory_request(reconf, outcome)
        if outcomes[-1] == "apply:waiting":
            sim.run_mig_manager()
            time.sleep(pause)
    reconf.refresh_from_db()
    return outcomes


def test_operator_path_sets_the_label_once_the_mounted_copy_has_the_config(tmp_path, settings):
    settings.MIG_PARTED_SYNC_S = 0.8
    sim = start_sim(tmp_path, [("gpu-b", "H100-80GB", 1, {0: ["3g.40gb", "3g.40gb"]}, "")], configmap_sync_delay=0.3)
    try:
        reconf = rc.create(node_row("gpu-b"), {"0": ["1g.10gb"] * 7}, backend="operator", force=True)

        drive_slowly(sim, reconf, pause=0.25)

        assert reconf.state == "succeeded", reconf.error
        assert sim.layout("gpu-b", 0) == [("1g.10gb", s) for s in range(7)]
        waits = list(reconf.steps.filter(step="apply", event="waiting").order_by("at", "id"))
        assert waits[0].message.startswith(f"wrote {reconf.config_name} to ConfigMap gpuaas-mig-parted-config;")
        assert "mounted copy (MIG_PARTED_SYNC_S=0.8)" in waits[0].message
        assert waits[1].message == f"set nvidia.com/mig.config={reconf.config_name}; MIG manager pending"
    finally:
        sim.server.stop()


def test_operator_path_waits_through_rebooting(tmp_path):
    sim = start_sim(tmp_path, [("gpu-c", "H100-80GB", 1, {0: ["7g.80gb"]}, "")], mig_mode_reboot=True)
    try:
        reconf = rc.create(node_row("gpu-c"), {"0": None}, backend="operator", force=True)

        outcomes = drive(sim, reconf)

        assert reconf.state == "succeeded", reconf.error
        assert outcomes.count("apply:waiting") == 2, outcomes
        assert reconf.steps.filter(
            step="apply",
            event="waiting",
            message="the MIG manager is rebooting gpu-c to change the MIG mode; waiting for it",
        ).exists()
        assert sim.node("gpu-c").gpu(0).mig_current == 0
    finally:
        sim.server.stop()
