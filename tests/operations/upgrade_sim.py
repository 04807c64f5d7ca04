"""Shared set-up for the rolling driver upgrade tests: a simulated fleet, an open window, a driver that
ticks the rollout, runs each drain's steps and the simulated upgrade controller. Not a test module."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drain_sim import TERMINAL, fleet, reserve

from capacity.models import MaintenanceWindow, NodeCapacity, NodeDrain
from operations.maintenance import rollout, rollout_tick
from operations.models import DriverUpgrade
from operations.tasks import drain_step_task, driver_upgrade_tick_task
from simcluster.gpuoperator import DriverUpgradeController

NAMES = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")


def open_window(cluster, *, hours: float = 4, node_group: str = "") -> MaintenanceWindow:
    now = timezone.now()
    return MaintenanceWindow.objects.create(
        cluster=cluster,
        node_group=node_group,
        starts_at=now - timedelta(minutes=5),
        ends_at=now + timedelta(hours=hours),
    )


def nodes(*names: str) -> list[NodeCapacity]:
    return list(NodeCapacity.objects.filter(name__in=names).order_by("name"))


def step_drains(upgrade: DriverUpgrade) -> None:
    """One call of each open drain's current step (the drain's own task, as a worker would)."""
    for drain in NodeDrain.objects.filter(upgrade_node__rollout=upgrade).order_by("pk"):
        if drain.state not in TERMINAL and drain.state != "running":
            drain_step_task(drain.pk, drain.step)


def run(sim, upgrade: DriverUpgrade, controller=None, *, rounds: int = 200, give_back: bool = False) -> DriverUpgrade:
    """Tick, step the drains and the controller until the rollout ends (or `rounds` run out).
    `give_back`: the operator gives back every node handed over (own_drain mode)."""
    controller = controller or DriverUpgradeController(max_parallel=upgrade.max_parallel)
    clock = 0.0
    for _ in range(rounds):
        driver_upgrade_tick_task(upgrade.pk)
        upgrade.refresh_from_db()
        if upgrade.finished_at is not None:
            break
        step_drains(upgrade)
        if give_back:
            for row in upgrade.nodes.filter(state="upgrading", drain__give_back_at__isnull=True):
                rollout.give_back_node(upgrade, row.node)
        with sim.state.lock:
            controller.step(sim.sim_cluster, clock)
        clock += 60
    upgrade.refresh_from_db()
    return upgrade


__all__ = ["NAMES", "fleet", "nodes", "open_window", "reserve", "rollout", "rollout_tick", "run"]
