"""Rolling driver upgrades: drains handed to the GPU Operator's upgrade controller (simulated states), waves
that never leave a reservation short, a node failing validation and one that never comes back."""

import pytest
from drain_sim import drive, fleet, reserve

from capacity.models import NodeCapacity
from operations import maintenance
from operations.maintenance import upgrades
from simcluster.gpuoperator import DRIVER_UPGRADE_LABEL, DriverUpgradeController

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = fleet(tmp_path)
    yield sim
    sim.server.stop()


def node(name: str) -> NodeCapacity:
    return NodeCapacity.objects.get(name=name)


def run_controller(sim, controller, *, until: float = 1000, tick: float = 30):
    clock = 0.0
    while clock <= until:
        with sim.state.lock:
            states = controller.step(sim.sim_cluster, clock)
        clock += tick
    return states


def test_upgrade_done_gives_the_node_back(sim):
    moving = reserve("gpu-a", 0)
    [drain] = maintenance.start_wave([node("gpu-a")], grace_s=0)
    drive(drain)
    assert (drain.step, drain.state) == ("handover", "waiting")
    assert sim.node("gpu-a").labels[DRIVER_UPGRADE_LABEL] == "upgrade-required"
    assert run_controller(sim, DriverUpgradeController())["gpu-a"] == "upgrade-done"

    outcomes = drive(drain)
    assert drain.state == "succeeded", (outcomes, [s.message for s in drain.steps.all()])
    assert drain.give_back_at is not None and not sim.node("gpu-a").unschedulable
    moving.refresh_from_db()
    assert moving.gpu.node.name != "gpu-a" and moving.released_at is None


def test_a_node_failing_validation_stays_in_maintenance_with_its_reservations_elsewhere(sim):
    moving = reserve("gpu-a", 0)
    [drain] = maintenance.start_wave([node("gpu-a")], grace_s=0)
    drive(drain)
    assert run_controller(sim, DriverUpgradeController(fail_validation={"gpu-a"}))["gpu-a"] == "upgrade-failed"
    drive(drain, max_calls=2)
    assert (drain.step, drain.state, drain.give_back_at) == ("handover", "waiting", None)
    assert "upgrade failed" in drain.steps.filter(event="waiting").last().message
    assert sim.node("gpu-a").unschedulable
    moving.refresh_from_db()
    assert moving.gpu.node.name != "gpu-a" and moving.released_at is None


def test_a_node_that_never_returns_is_never_given_back(sim):
    [drain] = maintenance.start_wave([node("gpu-a")], grace_s=0)
    drive(drain)
    states = run_controller(sim, DriverUpgradeController(never_return={"gpu-a"}), until=5000)
    assert states["gpu-a"] == "pod-restart-required" and not sim.node("gpu-a").ready
    drive(drain, max_calls=2)
    assert (drain.step, drain.state, drain.give_back_at) == ("handover", "waiting", None)


def test_a_wave_holds_only_the_nodes_the_free_reserve_absorbs_together(sim):
    for name in ("gpu-a", "gpu-b"):
        reserve(name, 0)
        reserve(name, 4)
    # Free: gpu-c's two 3g.40gb. Either loaded node alone fits; with the other loaded node two would be
    # short, and with gpu-c itself (empty, but the reserve gpu-a moves to) two as well.
    wave = maintenance.next_wave([node("gpu-a"), node("gpu-b"), node("gpu-c")], max_parallel=3)
    assert [n.name for n in wave] == ["gpu-a"]
    assert [n.name for n in maintenance.next_wave([node("gpu-c"), node("gpu-a")], max_parallel=3)] == ["gpu-c"]
    assert maintenance.next_wave([node("gpu-a"), node("gpu-b")], max_parallel=1) == [node("gpu-a")]


def test_the_controller_honours_max_parallel_upgrades(sim):
    with sim.state.lock:
        for name in ("gpu-a", "gpu-b", "gpu-c"):
            sim.node(name).labels[DRIVER_UPGRADE_LABEL] = "upgrade-required"
            sim.sim_cluster.touch(sim.node(name))
        controller = DriverUpgradeController(max_parallel=1)
        states = controller.step(sim.sim_cluster, 0.0)
    assert sorted(states.values()) == ["cordon-required", "upgrade-required", "upgrade-required"]
    assert upgrades.UPGRADE_STATE_LABEL == DRIVER_UPGRADE_LABEL


class WorkerKilled(BaseException):
    """Stands for SIGKILL of the worker: not an Exception, so nothing in the step catches it."""


@pytest.mark.parametrize("when", ["handing over", "at upgrade-done"])
def test_a_worker_killed_in_an_upgrade_waves_handover_hands_over_once(sim, monkeypatch, settings, when):
    from datetime import timedelta

    from django.utils import timezone

    from operations.tasks import drain_step_task

    reserve("gpu-a", 0)
    [drain] = maintenance.start_wave([node("gpu-a")], grace_s=0)
    for step in ("check", "notify", "cordon", "move", "evict"):
        assert drain_step_task(drain.pk, step) == "advanced", step
    if when == "at upgrade-done":
        assert drain_step_task(drain.pk, "handover") == "waiting"
        run_controller(sim, DriverUpgradeController())
    real = maintenance.STEPS["handover"]

    def work_then_die(row, now):
        real(row, now)
        raise WorkerKilled

    monkeypatch.setitem(maintenance.STEPS, "handover", work_then_die)
    with pytest.raises(WorkerKilled):
        drain_step_task(drain.pk, "handover")
    monkeypatch.setitem(maintenance.STEPS, "handover", real)
    lapsed = timezone.now() + timedelta(seconds=settings.WORKFLOW_LEASE_S + 1)
    assert maintenance.sweep(now=lapsed)["stale_claims"] == 1

    drive(drain)
    run_controller(sim, DriverUpgradeController())
    drive(drain)
    assert drain.state == "succeeded", drain.error
    assert drain.steps.filter(step="handover", detail__upgrade=True).count() == 1  # labelled upgrade-required once
    assert not sim.node("gpu-a").unschedulable
