"""The console: an operator starts a drain on the add page, sees a refusal with the shortfall, follows it."""

import pytest
from django.test import Client
from drain_sim import drive, fleet, reserve

from capacity.models import NodeCapacity, NodeDrain

pytestmark = pytest.mark.django_db
ADD = "/admin/capacity/nodedrain/add/"


@pytest.fixture
def sim(tmp_path):
    sim = fleet(tmp_path)
    yield sim
    sim.server.stop()


@pytest.fixture
def console(operator):
    client = Client()
    client.force_login(operator)
    return client


def test_operator_starts_a_drain_and_follows_it(sim, console, django_capture_on_commit_callbacks):
    reserve("gpu-a", 0)
    node = NodeCapacity.objects.get(name="gpu-a")
    with django_capture_on_commit_callbacks() as callbacks:
        response = console.post(ADD, {"node": node.pk, "reason": "firmware", "grace_s": 0})
    assert response.status_code == 302, response.content[-2000:]
    drain = NodeDrain.objects.get()
    assert (drain.node, drain.reason, drain.grace_s, len(callbacks)) == (node, "firmware", 0, 1)
    drive(drain)
    page = console.get(f"/admin/capacity/nodedrain/{drain.pk}/change/").content.decode()
    assert "in maintenance" in page and "gpu-a/0" in page
    response = console.post(
        "/admin/capacity/nodedrain/", {"action": "give_back_selected", "_selected_action": [drain.pk]}
    )
    assert response.status_code == 302
    drain.refresh_from_db()
    assert drain.give_back_at is not None


def test_a_refused_drain_shows_the_shortfall_and_writes_nothing(sim, console):
    for n in ("gpu-a", "gpu-b", "gpu-c"):
        reserve(n, 0)
        reserve(n, 4)
    node = NodeCapacity.objects.get(name="gpu-a")
    response = console.post(ADD, {"node": node.pk, "reason": "", "grace_s": 60})
    assert response.status_code == 200
    assert "short of 2 x H100-80GB 3g.40gb" in response.content.decode()
    assert not NodeDrain.objects.exists()


def test_a_member_cannot_open_the_page(sim, alice):
    client = Client()
    client.force_login(alice)
    assert client.get(ADD).status_code in (302, 403)
