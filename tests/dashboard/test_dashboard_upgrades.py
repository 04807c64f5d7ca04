"""The overview's rolling upgrades panel: each rollout under way with nodes done/total, failed, current wave
and next window, in a fixed number of queries however many rollouts and nodes there are."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity.models import MaintenanceWindow, NodeCapacity
from gpuaas.dashboard.upgrades import driver_upgrades_panel
from operations.models import DriverUpgrade, DriverUpgradeNode

pytestmark = pytest.mark.django_db


def _rollout(cluster, name, *, done=0, failed=0, pending=1, wave=1, state="running"):
    upgrade = DriverUpgrade.objects.create(cluster=cluster, name=name, max_parallel=2, current_wave=wave, state=state)
    states = ["done"] * done + ["failed"] * failed + ["pending"] * pending
    for n, node_state in enumerate(states):
        node = NodeCapacity.objects.create(cluster=cluster, name=f"{name}-{n}", gpu_count=1)
        DriverUpgradeNode.objects.create(rollout=upgrade, node=node, position=n, state=node_state)
    return upgrade


def test_the_panel_shows_progress_and_the_next_window(world):
    now = timezone.now()
    MaintenanceWindow.objects.create(
        cluster=world.alpha, starts_at=now + timedelta(hours=2), ends_at=now + timedelta(hours=4)
    )
    _rollout(world.alpha, "driver-570", done=3, failed=1, pending=2, wave=2)
    _rollout(world.beta, "finished", done=1, pending=0, state="succeeded")
    panel = driver_upgrades_panel()
    [item] = panel["items"]
    assert (item["rollout"], item["cluster"], item["done"], item["failed"], item["wave"]) == (
        "driver-570",
        "alpha",
        "3 / 6",
        1,
        2,
    )
    assert item["next_window"] == f"{now + timedelta(hours=2):%Y-%m-%d %H:%M} UTC"
    assert item["url"].startswith("/admin/operations/driverupgrade/")


def test_the_panel_reads_in_two_queries_whatever_the_rollouts(world, client, operator):
    MaintenanceWindow.objects.create(cluster=world.alpha, weekday=6, start_time="02:00", end_time="04:00")
    _rollout(world.alpha, "one", done=1)

    def count():
        with CaptureQueriesContext(connection) as queries:
            driver_upgrades_panel()
        return len(queries)

    before = count()
    assert before == 2
    _rollout(world.alpha, "two", done=2, failed=1, pending=3)
    _rollout(world.beta, "three", pending=4)
    assert count() == before
    client.force_login(operator)
    body = client.get("/admin/dashboard/data.json").json()
    assert [i["rollout"] for i in body["driver_upgrades"]["items"]] == ["three", "two", "one"]
