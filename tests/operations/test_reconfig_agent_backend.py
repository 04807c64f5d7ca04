"""MIG reconfiguration through the node agent: NVML creates and destroys instances at explicit placements."""

import pytest
from reconfig_sim import allocate, drive, gpu_row, node_row, start_sim

from capacity.adapters import kubernetes as kube
from capacity.agent import node as agent
from capacity.agent import protocol
from capacity.agent.tasks import apply_mig_task
from capacity.models import MigInstance, WorkloadProfile
from operations import reconfiguration as rc
from operations.reconfiguration.commands import record_result
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
        "apply:waiting",  # the signed command went to the node agent (drive serves it in-process)
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


def test_steps_run_on_the_control_plane_and_apply_sends_a_signed_command_to_the_node_queue(
    sim, monkeypatch, django_capture_on_commit_callbacks
):
    sent, commands = [], []
    monkeypatch.setattr(reconfiguration_step_task, "apply_async", lambda args, **options: sent.append((args, options)))
    monkeypatch.setattr(apply_mig_task, "apply_async", lambda args, **options: commands.append((args, options)))
    node = node_row("gpu-a")
    with django_capture_on_commit_callbacks(execute=True):
        reconf = rc.create(node, {"0": ["7g.80gb"]}, backend="agent", force=True)
    for step in ("plan", "check", "cordon", "drain"):
        with django_capture_on_commit_callbacks(execute=True):
            assert reconfiguration_step_task(reconf.pk, step) == "advanced"
    with django_capture_on_commit_callbacks(execute=True):
        assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"

    assert [(args[1], options.get("queue")) for args, options in sent] == [
        ("plan", None),
        ("check", None),
        ("cordon", None),
        ("drain", None),
        ("apply", None),
        ("apply", None),  # the waiting apply's next look for the result
    ]
    assert all(options["expires"] == 600 for _, options in sent[:5])
    [((command, api_url), options)] = commands
    assert options["queue"] == f"node.{sim.cluster.name}.gpu-a"
    assert protocol.verify(command)["kind"] == "mig-command"
    assert (command["cluster"], command["node"]) == (sim.cluster.name, "gpu-a")
    assert command["body"] == {
        "id": f"r{reconf.pk}-0",
        "product": "H100-80GB",
        "gpus": {"0": {"mig": True, "placements": [{"profile": "7g.80gb", "start": 0, "size": 8}]}},
    }
    with django_capture_on_commit_callbacks(execute=True):  # polled again before the result: not sent twice
        assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    assert len(commands) == 1


def test_a_command_or_result_of_another_node_is_refused(sim, settings):
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"]}, backend="agent", force=True)
    for step in ("plan", "check", "cordon", "drain"):
        reconfiguration_step_task(reconf.pk, step)
    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    reconf.refresh_from_db()
    api_url = kube.api_url_for(sim.cluster)
    settings.AGENT_NODE_KEY = protocol.node_key(settings.AGENT_SIGNING_SECRET, sim.cluster.name, "gpu-b").hex()
    settings.AGENT_CLUSTER_NAME, settings.AGENT_NODE_NAME = sim.cluster.name, "gpu-b"
    with pytest.raises(protocol.BadReport):  # gpu-b's agent does not carry out gpu-a's command
        agent.apply_mig(reconf.agent_command, api_url=api_url)
    settings.AGENT_NODE_KEY = ""
    result = agent.apply_mig(reconf.agent_command, api_url=api_url)
    forged = {**result, "node": "gpu-b"}
    assert record_result(forged).startswith("refused: signature does not match")
    tampered = {**result, "body": {**result["body"], "error": ""} | {"applied": {}}}
    assert record_result(tampered).startswith("refused")
    assert record_result(result) == "recorded"
    assert record_result(result) == "duplicate"  # a redelivered result is stored once
    assert reconfiguration_step_task(reconf.pk, "apply") == "advanced"


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
