"""Rolling driver upgrades as a rollout: waves inside maintenance windows under the reserve rule, both
modes, and a node that fails validation or never comes back."""

from datetime import timedelta

import pytest
from django.utils import timezone
from upgrade_sim import NAMES, fleet, nodes, open_window, reserve, rollout, rollout_tick, run

from capacity.models import NodeDrain
from pools.models import Allocation
from simcluster.gpuoperator import DRIVER_UPGRADE_LABEL, DriverUpgradeController

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path, settings):
    settings.DRIVER_UPGRADE_POLL_S = 1
    settings.MAINTENANCE_GRACE_S = 0
    sim = fleet(tmp_path, names=NAMES)
    yield sim
    sim.server.stop()


def test_every_node_is_upgraded_in_waves_with_every_reservation_kept(sim):
    kept = [reserve("gpu-a", 0), reserve("gpu-b", 0, "team-b")]
    open_window(sim.cluster)
    upgrade = rollout.create(sim.cluster, mode="controller", max_parallel=2)
    assert upgrade.max_parallel_source == "given"
    run(sim, upgrade)
    assert upgrade.state == "succeeded", (upgrade.error, upgrade.waiting_for)
    assert sorted(upgrade.nodes.values_list("state", flat=True)) == ["done"] * 4
    assert upgrade.current_wave >= 2
    for row in upgrade.nodes.all():
        assert row.draining_at <= row.upgrading_at <= row.done_at
        assert sim.node(row.node.name).labels[DRIVER_UPGRADE_LABEL] == "upgrade-done"
    for a in kept:
        a.refresh_from_db()
        assert a.released_at is None
    for row in upgrade.nodes.select_related("drain"):
        wave = set(upgrade.nodes.filter(wave=row.wave).values_list("node__name", flat=True))
        moved = [m["allocation"] for m in row.drain.moves]
        assert len(moved) == len(set(moved))  # each reservation moved once by a node's drain
        assert not {m["to"].split("/")[0] for m in row.drain.moves} & wave  # never onto a node of its own wave


def test_waves_wait_for_a_closed_window_and_start_when_it_opens(sim):
    window = open_window(sim.cluster)
    window.starts_at = timezone.now() + timedelta(hours=1)
    window.ends_at = timezone.now() + timedelta(hours=2)
    window.save()
    upgrade = rollout.create(sim.cluster, mode="controller", max_parallel=1)
    run(sim, upgrade, rounds=3)
    assert upgrade.state == "running" and upgrade.current_wave == 0
    assert "no maintenance window" in upgrade.waiting_for
    assert upgrade.next_window_at == window.starts_at
    assert not NodeDrain.objects.exists()
    window.starts_at = timezone.now() - timedelta(minutes=1)
    window.save()
    run(sim, upgrade)
    assert upgrade.state == "succeeded"


def test_a_window_closing_lets_the_running_wave_finish_but_starts_no_new_one(sim):
    window = open_window(sim.cluster)
    upgrade = rollout.create(sim.cluster, mode="controller", max_parallel=2)
    rollout_tick.tick(upgrade.pk, token="t")
    upgrade.refresh_from_db()
    assert upgrade.current_wave == 1 and upgrade.nodes.filter(state="draining").count() == 2
    window.ends_at = timezone.now()
    window.save()
    run(sim, upgrade, rounds=40)
    assert upgrade.state == "running" and upgrade.current_wave == 1
    assert sorted(upgrade.nodes.values_list("state", flat=True)) == ["done", "done", "pending", "pending"]


def test_the_reserve_rule_keeps_waves_small_enough(sim):
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        reserve(name, 0)
        reserve(name, 4, "team-b")
    # Free: gpu-d's two 3g.40gb (and the whole second GPUs): one loaded node at a time.
    open_window(sim.cluster)
    upgrade = rollout.create(sim.cluster, nodes=nodes("gpu-a", "gpu-b", "gpu-c"), mode="controller", max_parallel=3)
    rollout_tick.tick(upgrade.pk, token="t")
    assert upgrade.nodes.filter(wave=1).count() == 1
    run(sim, upgrade)
    assert upgrade.state == "succeeded" and upgrade.current_wave == 3
    assert Allocation.objects.active().count() == 6


def test_a_node_failing_validation_is_failed_and_the_rollout_goes_on(sim):
    moving = reserve("gpu-a", 0)
    open_window(sim.cluster)
    upgrade = rollout.create(sim.cluster, mode="controller", max_parallel=2)
    run(sim, upgrade, DriverUpgradeController(max_parallel=2, fail_validation={"gpu-a"}))
    assert upgrade.state == "failed" and upgrade.error == "1 node(s) failed: gpu-a"
    failed = upgrade.nodes.get(node__name="gpu-a")
    assert failed.state == "failed" and "validation" in failed.error
    assert sorted(upgrade.nodes.values_list("state", flat=True)) == ["done", "done", "done", "failed"]
    assert sim.node("gpu-a").unschedulable and failed.drain.handed_over  # stays in maintenance
    moving.refresh_from_db()
    assert moving.released_at is None and moving.gpu.node.name != "gpu-a"


def test_a_node_that_never_comes_back_is_failed_after_the_timeout(sim, settings):
    settings.DRIVER_UPGRADE_TIMEOUT_S = 60
    open_window(sim.cluster)
    upgrade = rollout.create(sim.cluster, nodes=nodes("gpu-a", "gpu-b"), mode="controller", max_parallel=1)
    run(sim, upgrade, DriverUpgradeController(never_return={"gpu-a"}), rounds=25)
    row = upgrade.nodes.get(node__name="gpu-a")
    assert row.state == "upgrading"
    later = timezone.now() + timedelta(seconds=61)
    assert rollout_tick.tick(upgrade.pk, token="t", now=later)
    row.refresh_from_db()
    assert row.state == "failed" and "never came back" in row.error
    assert row.drain.is_open and sim.node("gpu-a").unschedulable
    rollout.poke(upgrade)  # back to the real clock: the next tick is due now
    run(sim, upgrade)
    assert upgrade.state == "failed" and upgrade.nodes.get(node__name="gpu-b").state == "done"


def test_own_drain_mode_waits_for_the_operator_to_give_each_node_back(sim):
    reserve("gpu-a", 0)
    open_window(sim.cluster)
    upgrade = rollout.create(sim.cluster, nodes=nodes("gpu-a", "gpu-b"), mode="own_drain", max_parallel=2)
    run(sim, upgrade, rounds=10)
    assert sorted(upgrade.nodes.values_list("state", flat=True)) == ["upgrading", "upgrading"]
    assert DRIVER_UPGRADE_LABEL not in sim.node("gpu-a").labels  # the controller is not asked
    run(sim, upgrade, give_back=True)
    assert upgrade.state == "succeeded"
    assert all(not sim.node(n).unschedulable for n in ("gpu-a", "gpu-b"))


def test_pause_holds_new_waves_and_cancel_leaves_the_rest_pending(sim):
    open_window(sim.cluster)
    upgrade = rollout.create(sim.cluster, mode="controller", max_parallel=1)
    rollout.pause(upgrade)
    run(sim, upgrade, rounds=3)
    assert upgrade.state == "paused" and upgrade.current_wave == 0
    rollout.resume(upgrade)
    rollout_tick.tick(upgrade.pk, token="t")
    rollout.cancel(upgrade)
    run(sim, upgrade)
    assert upgrade.state == "cancelled" and upgrade.finished_at is not None
    assert sorted(upgrade.nodes.values_list("state", flat=True)) == ["done", "pending", "pending", "pending"]
