"""The console: an operator starts a rolling upgrade on the add page, sees field errors, follows its progress
and nodes, and pauses it with an action; a project admin cannot open the page."""

import pytest
from django.test import Client
from upgrade_sim import NAMES, fleet, nodes, open_window, run

from operations.models import DriverUpgrade

pytestmark = pytest.mark.django_db
ADD = "/admin/operations/driverupgrade/add/"
LIST = "/admin/operations/driverupgrade/"


@pytest.fixture
def sim(tmp_path, settings):
    settings.DRIVER_UPGRADE_POLL_S = 1
    settings.MAINTENANCE_GRACE_S = 0
    sim = fleet(tmp_path, names=NAMES)
    yield sim
    sim.server.stop()


@pytest.fixture
def console(operator):
    client = Client()
    client.force_login(operator)
    return client


def test_operator_starts_follows_and_pauses_a_rollout(sim, console, django_capture_on_commit_callbacks):
    open_window(sim.cluster)
    chosen = [n.pk for n in nodes("gpu-a", "gpu-b")]
    with django_capture_on_commit_callbacks() as callbacks:
        response = console.post(
            ADD,
            {
                "cluster": sim.cluster.pk,
                "node_group": "",
                "nodes": chosen,
                "name": "driver 570",
                "mode": "controller",
                "max_parallel": 1,
                "grace_s": 0,
            },
        )
    assert response.status_code == 302, response.content[-3000:]
    upgrade = DriverUpgrade.objects.get()
    assert (upgrade.name, upgrade.mode, upgrade.max_parallel, upgrade.nodes.count(), len(callbacks)) == (
        "driver 570",
        "controller",
        1,
        2,
        1,
    )
    run(sim, upgrade, rounds=30)
    listing = console.get(LIST).content.decode()
    assert "driver 570" in listing and "/ 2" in listing
    page = console.get(f"{LIST}{upgrade.pk}/change/").content.decode()
    assert "gpu-a" in page and "gpu-b" in page and "/admin/capacity/nodedrain/" in page
    if upgrade.state == "running":
        response = console.post(LIST, {"action": "pause_selected", "_selected_action": [upgrade.pk]})
        assert response.status_code == 302
        upgrade.refresh_from_db()
        assert upgrade.state == "paused"


def test_an_empty_selection_is_a_field_error_and_writes_nothing(sim, console):
    response = console.post(ADD, {"cluster": sim.cluster.pk, "node_group": "nowhere", "name": "", "mode": ""})
    assert response.status_code == 200
    assert "no GPU nodes to upgrade" in response.content.decode()
    assert not DriverUpgrade.objects.exists()


def test_a_project_admin_cannot_open_the_console(sim, alice):
    client = Client()
    client.force_login(alice)
    assert client.get(ADD).status_code in (302, 403)
    assert client.get(LIST).status_code in (302, 403)
