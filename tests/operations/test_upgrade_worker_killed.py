"""A worker killed at each step of an upgrade wave: the rollout's own steps (plan the wave, start its drains,
follow it while the controller works, plan the next wave) and the drain steps the wave runs through (the
handover that labels upgrade-required, the handover that takes the node back at upgrade-done, the uncordon
that gives it back). Recovered by the beat sweep once the lease lapses, or by the same task redelivered;
the rollout then finishes with each node drained once, each reservation moved once by it, and the
controller asked once per node."""

from datetime import timedelta

import pytest
from django.utils import timezone
from upgrade_sim import NAMES, fleet, open_window, reserve, rollout, rollout_tick, run

from capacity.models import NodeDrain
from operations import maintenance
from operations.tasks import drain_step_task, driver_upgrade_tick_task
from pools.models import Allocation

pytestmark = pytest.mark.django_db


class WorkerKilled(BaseException):
    """Stands for SIGKILL of the worker: not an Exception, so nothing in the step catches it."""


@pytest.fixture
def sim(tmp_path, settings):
    settings.DRIVER_UPGRADE_POLL_S = 1
    settings.MAINTENANCE_GRACE_S = 0
    sim = fleet(tmp_path, names=NAMES)
    yield sim
    sim.server.stop()


def _arm_rollout(monkeypatch, name: str, *, wave: int = 1):
    """Kill the worker right after the rollout function `name` did its work (in wave `wave`)."""
    real = getattr(rollout_tick, name)

    def work_then_die(upgrade, now):
        result = real(upgrade, now)
        upgrade.refresh_from_db()
        if upgrade.current_wave == wave and (name != "follow" or upgrade.nodes.filter(state="upgrading").exists()):
            monkeypatch.setattr(rollout_tick, name, real)
            raise WorkerKilled
        return result

    monkeypatch.setattr(rollout_tick, name, work_then_die)


def _arm_drain(monkeypatch, step: str, *, when=lambda drain: True):
    real = maintenance.STEPS[step]

    def work_then_die(drain, now):
        result = real(drain, now)
        if when(drain):
            monkeypatch.setitem(maintenance.STEPS, step, real)
            raise WorkerKilled
        return result

    monkeypatch.setitem(maintenance.STEPS, step, work_then_die)


def _labelled(drain) -> bool:
    return drain.steps.filter(detail__upgrade=True).exists()


def _taken_back(drain) -> bool:
    drain.refresh_from_db(fields=["give_back_at"])
    return drain.give_back_at is not None


KILLS = {
    "plan wave": lambda mp: _arm_rollout(mp, "plan_wave"),
    "start drains": lambda mp: _arm_rollout(mp, "start_planned"),
    "handover (label upgrade-required)": lambda mp: _arm_drain(mp, "handover", when=_labelled),
    "waiting for upgrade-done": lambda mp: _arm_rollout(mp, "follow"),
    "give back (upgrade-done)": lambda mp: _arm_drain(mp, "handover", when=_taken_back),
    "give back (uncordon)": lambda mp: _arm_drain(mp, "uncordon"),
    "next wave": lambda mp: _arm_rollout(mp, "plan_wave", wave=2),
}


@pytest.mark.parametrize("recovery", ["sweep", "redelivery"])
@pytest.mark.parametrize("kill", list(KILLS))
def test_a_worker_killed_in_an_upgrade_wave_is_recovered(sim, monkeypatch, settings, kill, recovery):
    reservations = [reserve("gpu-a", 0), reserve("gpu-a", 4, "team-b"), reserve("gpu-c", 0)]
    open_window(sim.cluster)
    upgrade = rollout.create(sim.cluster, mode="controller", max_parallel=2)
    KILLS[kill](monkeypatch)
    with pytest.raises(WorkerKilled):
        run(sim, upgrade)

    lapsed = timezone.now() + timedelta(seconds=settings.WORKFLOW_LEASE_S + 1)
    running = NodeDrain.objects.filter(state="running").first()
    if recovery == "sweep":
        if running is not None:
            assert maintenance.sweep(now=timezone.now())["stale_claims"] == 0  # the lease still runs
            assert maintenance.sweep(now=lapsed)["stale_claims"] == 1
        else:
            assert rollout_tick.sweep(now=timezone.now()) == {"stale_claims": 0, "requeued": 0}
            assert rollout_tick.sweep(now=lapsed)["stale_claims"] == 1
    elif running is not None:
        assert drain_step_task(running.pk, running.step) in ("advanced", "waiting")  # same task id: re-entered
    else:
        assert driver_upgrade_tick_task(upgrade.pk) not in ("busy", "early")  # the same token re-enters

    run(sim, upgrade)
    assert upgrade.state == "succeeded", (upgrade.error, upgrade.waiting_for)
    assert sorted(upgrade.nodes.values_list("state", flat=True)) == ["done"] * 4
    assert NodeDrain.objects.count() == 4  # each node drained once
    for drain in NodeDrain.objects.all():
        moved = [m["allocation"] for m in drain.moves]
        assert len(moved) == len(set(moved)) == drain.steps.filter(step="move", event="info").count()
        assert drain.steps.filter(step="handover", detail__upgrade=True).count() == 1  # labelled once
        assert not sim.node(drain.node.name).unschedulable
    assert Allocation.objects.active().count() == len(reservations)
