"""MIG reconfiguration through the node agent: NVML creates and destroys instances at explicit placements."""

import pytest
from reconfig_sim import allocate, drive, gpu_row, node_row, start_sim

from capacity.models import MigInstance, WorkloadProfile
from operations import reconfiguration as rc
from operations.tasks import reconfiguration_step_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"], 1: ["7g.80gb"]}, "")])
    yield sim
    sim.server.stop()


def test_instances_are_created_at_the_planned_placements(sim):
    node = node_row("gpu-a")
    target = {
        "0": [
            {"profile": "4g.40gb", "start": 0},
            {"profile": "1g.10gb", "start": 4},
            {"profile": "1g.20gb", "start": 6},
        ]
    }
    reconf = rc.create(node, target, backend="agent", force=True)

    outcomes = drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert outcomes == [
        "plan:advanced",
        "check:advanced",
        "cordon:advanced",
        "drain:advanced",
        "apply:advanced",
        "verify:waiting",  # nvidia.com/mig.config set to the new layout; the MIG manager asserts it
        "verify:advanced",
        "uncordon:advanced",
    ]
    assert sim.layout("gpu-a", 0) == [("4g.40gb", 0), ("1g.10gb", 4), ("1g.20gb", 6)]
    assert sim.db_layout("gpu-a", 0) == [("4g.40gb", 0), ("1g.10gb", 4), ("1g.20gb", 6)]
    assert sim.layout("gpu-a", 1) == [("7g.80gb", 0)]  # not targeted, not touched
    applied = reconf.steps.get(step="apply", event="completed")
    assert applied.detail["applied"]["0"] == {
        "destroyed": ["3g.40gb@0", "3g.40gb@4"],
        "created": ["4g.40gb@0", "1g.20gb@6", "1g.10gb@4"],
        "kept": [],
    }
    # The MIG manager runs on the node: the label names the new layout, so it survives a reboot.
    labels = sim.node("gpu-a").labels
    assert labels["nvidia.com/mig.config"] == f"gpuaas-r{reconf.pk}" == reconf.config_name
    assert labels["nvidia.com/mig.config.state"] == "success"


def test_mig_can_be_turned_off_and_on(sim):
    node = node_row("gpu-a")
    reconf = rc.create(node, {"0": None, "1": ["1g.10gb", "1g.10gb"]}, backend="agent", force=True)
    drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert sim.node("gpu-a").gpu(0).mig_enabled is False
    assert gpu_row("gpu-a", 0).mig_mode_current is False
    assert [p for p, _ in sim.layout("gpu-a", 1)] == ["1g.10gb", "1g.10gb"]


def test_allocated_instance_stays_in_place_with_drain(sim):
    kept = allocate(gpu_row("gpu-a", 0), mig_start=4)
    uuid = kept.mig_instance.uuid
    node = node_row("gpu-a")
    reconf = rc.create(
        node, {"0": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}, backend="agent", drain=True, force=True
    )
    drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert ("3g.40gb", 4) in sim.layout("gpu-a", 0)
    assert sorted(p for p, _ in sim.layout("gpu-a", 0)) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    kept.refresh_from_db()
    assert kept.mig_instance.uuid == uuid
    assert kept.mig_instance.state == "active"
    applied = reconf.steps.get(step="apply", event="completed").detail["applied"]["0"]
    assert applied["kept"] == ["3g.40gb@4"]
    assert MigInstance.objects.get(uuid=uuid).placement_start == 4


def test_apply_goes_to_the_node_queue(sim, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr(reconfiguration_step_task, "apply_async", lambda args, **options: sent.append((args, options)))
    node = node_row("gpu-a")
    with django_capture_on_commit_callbacks(execute=True):
        reconf = rc.create(node, {"0": ["7g.80gb"]}, backend="agent", force=True)
    for step in ("plan", "check", "cordon", "drain"):
        with django_capture_on_commit_callbacks(execute=True):
            assert reconfiguration_step_task(reconf.pk, step) == "advanced"

    assert [(args[1], options.get("queue")) for args, options in sent] == [
        ("plan", None),
        ("check", None),
        ("cordon", None),
        ("drain", None),
        ("apply", f"node.{sim.cluster.name}.gpu-a"),
    ]
    assert all(options["expires"] == 600 for _, options in sent)


def test_pods_on_untouched_gpus_do_not_hold_the_agent_path(sim):
    sim.add_gpu_pod("gpu-a", "trainer", "nvidia.com/mig-7g.80gb")
    sim.discover()
    assert WorkloadProfile.objects.running().get(pod_name="trainer").mig_instance.gpu.index == 1
    node = node_row("gpu-a")
    reconf = rc.create(node, {"0": ["7g.80gb"]}, backend="agent", force=True)
    drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert reconf.plan["affected"] == [0]
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert ("team-a", "trainer") in sim.sim_cluster.pods


def test_pods_on_the_node_hold_the_operator_path_until_they_finish(sim, settings):
    sim.add_gpu_pod("gpu-a", "trainer", "nvidia.com/mig-7g.80gb")
    node = node_row("gpu-a")
    reconf = rc.create(node, {"0": ["7g.80gb"]}, force=True)
    for step in ("plan", "check", "cordon"):
        assert reconfiguration_step_task(reconf.pk, step) == "advanced"

    assert reconfiguration_step_task(reconf.pk, "drain") == "waiting"
    assert reconfiguration_step_task(reconf.pk, "drain") == "waiting"
    reconf.refresh_from_db()
    waits = reconf.steps.filter(step="drain", event="waiting")
    assert [w.message for w in waits] == [
        "1 GPU pod(s) still running, waiting for them to finish (drain not chosen): team-a/trainer"
    ]
    with sim.state.lock:
        from simcluster.kube import ClusterApi

        ClusterApi(sim.sim_cluster).delete("pods", "team-a", "trainer")
    assert reconfiguration_step_task(reconf.pk, "drain") == "advanced"
