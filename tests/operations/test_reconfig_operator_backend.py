"""MIG reconfiguration through the GPU Operator: gpuaas's mig-parted ConfigMap, the label, the state label."""

from datetime import timedelta

import pytest
import yaml
from django.db.models import F
from reconfig_sim import drive, gpu_row, node_row, serve_inventory, start_sim

from capacity.adapters import kubernetes as kube
from capacity.adapters import nvml
from capacity.agent.tasks import read_node_inventory_task
from capacity.models import MigLayout, MigReconfigurationStep, NodeCapacity
from core.celery import node_queue
from operations import reconfiguration as rc
from operations.tasks import reconfiguration_step_task
from simcluster.gpuoperator import GPUAAS_MIG_CONFIGMAP, mig_config_source, parse_mig_parted

pytestmark = pytest.mark.django_db

STEPS = ["plan", "check", "cordon", "drain", "apply", "verify", "uncordon"]


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


def test_custom_layout_is_applied_by_the_mig_manager_and_verified(sim, operator):
    layout = MigLayout(name="infer-mix", product="H100-80GB", gpus={"0": ["4g.40gb", "3g.40gb"], "1": ["7g.80gb"]})
    layout.full_clean()
    layout.save()
    node = node_row("gpu-a")
    source, target = rc.target_from(node, layout=layout)
    reconf = rc.create(node, target, source=source, layout=layout, force=True, actor=operator)

    outcomes = drive(sim, reconf)

    assert reconf.state == "succeeded", reconf.error
    assert outcomes == [
        "plan:advanced",
        "check:advanced",
        "cordon:advanced",
        "drain:advanced",
        "apply:waiting",
        "apply:advanced",
        "verify:advanced",
        "uncordon:advanced",
    ]
    assert reconf.config_name == "gpuaas-infer-mix"
    labels = sim.node("gpu-a").labels
    assert labels["nvidia.com/mig.config"] == "gpuaas-infer-mix"
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert sorted(p for p, _ in sim.layout("gpu-a", 0)) == ["3g.40gb", "4g.40gb"]
    assert sim.layout("gpu-a", 1) == [("7g.80gb", 0)]
    assert sorted(p for p, _ in sim.db_layout("gpu-a", 0)) == ["3g.40gb", "4g.40gb"]
    assert sim.node("gpu-a").unschedulable is False
    assert reconf.was_cordoned is False
    assert reconf.previous["gpus"]["0"] == {
        "mig": True,
        "placements": [
            {"profile": "3g.40gb", "start": 0, "size": 4},
            {"profile": "3g.40gb", "start": 4, "size": 4},
        ],
    }
    assert reconf.previous["gpus"]["1"] == {"mig": False, "placements": []}
    for field in (
        "planned_at",
        "checked_at",
        "cordoned_at",
        "drained_at",
        "applied_at",
        "verified_at",
        "uncordoned_at",
    ):
        assert getattr(reconf, field) is not None, field


def test_audit_trail_has_every_step_in_order(sim, operator):
    node = node_row("gpu-a")
    source, target = rc.target_from(node, named="all-1g.10gb")
    reconf = rc.create(node, target, source=source, force=True, actor=operator)
    drive(sim, reconf)

    rows = list(MigReconfigurationStep.objects.filter(reconfiguration=reconf).order_by("at", "id"))
    events = [(r.step, r.event) for r in rows]
    assert events[0] == ("plan", "created")
    assert rows[0].actor == operator
    for step in STEPS:
        assert (step, "started") in events, step
        assert (step, "completed") in events, step
        assert events.index((step, "started")) < events.index((step, "completed"))
    completed = [s for s, e in events if e == "completed"]
    assert completed == STEPS
    assert ("apply", "waiting") in events
    assert [r.message for r in rows if (r.step, r.event) == ("apply", "info")] == [
        "config all-1g.10gb chosen (label was unset)"
    ]
    assert all(r.task_id == "local" for r in rows if r.event in ("started", "completed"))
    assert reconf.state == "succeeded"
    assert sim.layout("gpu-a", 1) == [("1g.10gb", s) for s in range(7)]


def test_gpuaas_configmap_holds_named_and_custom_configs_in_mig_parted_format(sim):
    layout = MigLayout.objects.create(
        name="split", product="H100-80GB", gpus={"0": ["3g.40gb", "3g.40gb"], "1": ["3g.40gb", "3g.40gb"], "2": None}
    )
    MigLayout.objects.create(name="sevens", product="H100-80GB", gpus={"all": ["1g.10gb"] * 7})
    from capacity.services.mig_configs import write_mig_parted_config

    write_mig_parted_config(sim.cluster)

    source = mig_config_source(sim.sim_cluster)
    assert source[0] == GPUAAS_MIG_CONFIGMAP  # the MIG manager reads ours first
    configs = parse_mig_parted(source[1])  # the simulator's spec.go rules accept it
    assert configs[layout.config_name] == [
        {"device-filter": ["0x233010DE"], "devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"device-filter": ["0x233010DE"], "devices": [2], "mig-enabled": False},
    ]
    assert configs["gpuaas-sevens"] == [
        {"device-filter": ["0x233010DE"], "devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}
    ]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert configs["all-enabled"] == [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]
    h100 = [e for e in configs["all-balanced"] if "0x233010DE" in e["device-filter"]]
    assert [e["mig-devices"] for e in h100] == [{"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}]
    document = yaml.safe_load(source[1])
    assert list(document) == ["version", "mig-configs"]
    assert document["version"] == "v1"


def test_the_label_path_applies_a_layout_from_our_configmap(sim):
    """An operator can apply a gpuaas layout with nothing but the label, as the GPU Operator intends."""
    MigLayout.objects.create(name="halves", product="H100-80GB", gpus={"all": ["3g.40gb", "3g.40gb"]})
    from capacity.services.mig_configs import write_mig_parted_config

    write_mig_parted_config(sim.cluster)
    with sim.state.lock:
        from simcluster.kube import ClusterApi

        ClusterApi(sim.sim_cluster).patch(
            "nodes",
            None,
            "gpu-a",
            {"metadata": {"labels": {"nvidia.com/mig.config": "gpuaas-halves"}}},
            "application/merge-patch+json",
        )
    sim.run_mig_manager()

    assert sim.node("gpu-a").labels["nvidia.com/mig.config.state"] == "success"
    assert sim.layout("gpu-a", 1) == [("3g.40gb", 0), ("3g.40gb", 4)]


def test_a_gpu_already_in_the_target_is_left_alone(sim):
    before = gpu_row("gpu-a", 0).mig_instances.filter(state="active").order_by("placement_start")
    uuids = [i.uuid for i in before]
    node = node_row("gpu-a")
    reconf = rc.create(node, {"0": ["3g.40gb", "3g.40gb"], "1": ["7g.80gb"]}, force=True)
    drive(sim, reconf)

    assert reconf.state == "succeeded", getattr(sim.node("gpu-a"), "mig_message", "")
    assert reconf.plan["changed"] == [1]
    assert reconf.plan["gpus"]["0"]["changed"] is False
    after = gpu_row("gpu-a", 0).mig_instances.filter(state="active").order_by("placement_start")
    assert [i.uuid for i in after] == uuids


def test_nothing_to_change_skips_to_uncordon(sim):
    node = node_row("gpu-a")
    reconf = rc.create(node, {"0": ["3g.40gb", "3g.40gb"]}, force=True)
    outcomes = drive(sim, reconf)

    assert outcomes == ["plan:advanced", "uncordon:advanced"]
    assert reconf.state == "succeeded"
    assert reconf.cordoned_at is None
    assert "nvidia.com/mig.config" not in sim.node("gpu-a").labels
    assert sim.node("gpu-a").unschedulable is False


def test_two_nodes_applied_at_once_both_find_their_config(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 1, None, ""), ("gpu-b", "H100-80GB", 1, None, "")])
    try:
        first = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"]}, force=True)
        second = rc.create(node_row("gpu-b"), {"0": ["2g.20gb", "2g.20gb"]}, force=True)
        for reconf in (first, second):
            for step in ("plan", "check", "cordon", "drain"):
                assert reconfiguration_step_task(reconf.pk, step) == "advanced"
        assert reconfiguration_step_task(first.pk, "apply") == "waiting"
        assert reconfiguration_step_task(second.pk, "apply") == "waiting"
        sim.run_mig_manager()  # the manager handles both nodes from the one file
        drive(sim, first)
        drive(sim, second)
        configs = parse_mig_parted(mig_config_source(sim.sim_cluster)[1])
    finally:
        sim.server.stop()

    assert (first.state, second.state) == ("succeeded", "succeeded")
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert [p for p, _ in sim.layout("gpu-b", 0)] == ["2g.20gb", "2g.20gb"]  # mig-parted picks the starts
    assert {f"gpuaas-r{first.pk}", f"gpuaas-r{second.pk}"} <= set(configs)


def test_site_configs_of_the_default_configmap_are_carried_over(sim):
    from simcluster.gpuoperator import add_mig_configs

    site = [{"devices": "all", "mig-enabled": True, "mig-devices": {"4g.40gb": 1, "3g.40gb": 1}}]
    with sim.state.lock:
        add_mig_configs(
            sim.sim_cluster, {"prod-4g-3g": site, "all-balanced": [{"devices": "all", "mig-enabled": False}]}
        )
    from capacity.services.mig_configs import write_mig_parted_config

    write_mig_parted_config(sim.cluster)

    configs = parse_mig_parted(mig_config_source(sim.sim_cluster)[1])
    assert configs["prod-4g-3g"] == site  # a node labelled with it still finds it in our file
    assert configs["all-balanced"][0]["mig-enabled"] is True  # ours wins on a name clash


def test_verify_waits_for_an_inventory_the_node_agent_read_after_the_mig_manager_succeeded(
    tmp_path, django_capture_on_commit_callbacks, monkeypatch
):
    """The rows already show the planned profiles (one 1g.10gb, elsewhere): only a read made after the MIG
    manager's `success` may verify. Apply and verify ask the node's agent for it; neither reads NVML itself."""
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 1, {0: ["1g.10gb"]}, "")])
    try:
        sent = []
        monkeypatch.setattr(
            read_node_inventory_task, "apply_async", lambda args, **options: sent.append((args, options["queue"]))
        )
        monkeypatch.setattr(nvml, "node_inventory", None)  # no step reads NVML in this process
        # Discovery read the node a minute before (here: this same second, which counts as after the change).
        a_minute_before = F("inventory_read_at") - timedelta(minutes=1)
        NodeCapacity.objects.filter(name="gpu-a").update(inventory_read_at=a_minute_before)
        reconf = rc.create(node_row("gpu-a"), {"0": [{"profile": "1g.10gb", "start": 3}]}, force=True)
        before = sim.db_layout("gpu-a", 0)
        assert before != [("1g.10gb", 3)]
        for step in ("plan", "check", "cordon", "drain"):
            assert reconfiguration_step_task(reconf.pk, step) == "advanced"
        assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
        sim.run_mig_manager()
        with django_capture_on_commit_callbacks(execute=True):
            assert reconfiguration_step_task(reconf.pk, "apply") == "advanced"
            assert reconfiguration_step_task(reconf.pk, "verify") == "waiting"

        reconf.refresh_from_db()
        queue = node_queue(sim.cluster.name, "gpu-a")
        assert sent == [((sim.cluster.name, "gpu-a", kube.api_url_for(sim.cluster)), queue)] * 2
        assert sim.db_layout("gpu-a", 0) == before  # nothing was read here
        waiting = reconf.steps.get(step="verify", event="waiting")
        assert waiting.message == (
            f"waiting for the node agent's NVML inventory of gpu-a read since {reconf.applied_at:%H:%M:%S} UTC"
        )
        monkeypatch.undo()

        serve_inventory(reconf)  # the agent reads and publishes, the ingest worker writes
        assert reconfiguration_step_task(reconf.pk, "verify") == "advanced"
        assert reconfiguration_step_task(reconf.pk, "uncordon") == "advanced"
        reconf.refresh_from_db()
        assert reconf.state == "succeeded", reconf.error
        assert sim.db_layout("gpu-a", 0) == sim.layout("gpu-a", 0)
        assert reconf.plan["gpus"]["0"]["placements"] == [
            {"profile": p, "start": s, "size": 1} for p, s in sim.layout("gpu-a", 0)
        ]
    finally:
        sim.server.stop()


def test_verify_says_when_the_agents_inventory_read_failed_and_carries_on_with_the_next_good_one(sim, settings):
    a_minute_before = F("inventory_read_at") - timedelta(minutes=1)
    NodeCapacity.objects.filter(name="gpu-a").update(inventory_read_at=a_minute_before)
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    for step in ("plan", "check", "cordon", "drain"):
        assert reconfiguration_step_task(reconf.pk, step) == "advanced"
    assert reconfiguration_step_task(reconf.pk, "apply") == "waiting"
    sim.run_mig_manager()
    assert reconfiguration_step_task(reconf.pk, "apply") == "advanced"
    working, settings.NVML_LIBRARY = settings.NVML_LIBRARY, "capacity.adapters.nvml.no_such_factory"
    reconf.refresh_from_db()
    assert serve_inventory(reconf)[sim.cluster.name].errors  # the agent answered, with an NVML error

    assert reconfiguration_step_task(reconf.pk, "verify") == "waiting"
    error = node_row("gpu-a").inventory_error
    assert error
    assert reconf.steps.get(step="verify", event="waiting").message == (
        f"waiting for the node agent's NVML inventory of gpu-a read since {reconf.applied_at:%H:%M:%S} UTC"
        f" (its latest read failed: {error})"
    )
    settings.NVML_LIBRARY = working
    serve_inventory(reconf)
    assert reconfiguration_step_task(reconf.pk, "verify") == "advanced"
    assert sim.db_layout("gpu-a", 1) == [("7g.80gb", 0)]
