"""Operator API of drain-and-move: who may start one, refusals with the shortfall, progress and give-back."""

import pytest
from drain_sim import drive, fleet, reserve
from rest_framework.test import APIClient

from capacity.models import NodeCapacity, NodeDrain
from pools.models import Allocation

pytestmark = pytest.mark.django_db
URL = "/api/v1/node-drains/"


@pytest.fixture
def sim(tmp_path):
    sim = fleet(tmp_path)
    yield sim
    sim.server.stop()


@pytest.fixture
def api(operator):
    client = APIClient()
    client.force_authenticate(operator)
    return client


def node_pk(name: str) -> int:
    return NodeCapacity.objects.get(name=name).pk


@pytest.mark.parametrize("persona", ["alice", "bob", "charlie"])
def test_members_and_project_admins_cannot_start_or_read_drains(
    sim, request, persona, django_capture_on_commit_callbacks
):
    user = request.getfixturevalue(persona)  # the personas' projects first: reserve() reuses team-a
    reserve("gpu-a", 0)
    client = APIClient()
    assert client.post(URL, {"node": node_pk("gpu-a")}, format="json").status_code == 401
    client.force_authenticate(user)
    with django_capture_on_commit_callbacks() as callbacks:
        assert client.post(URL, {"node": node_pk("gpu-a")}, format="json").status_code == 403
    assert client.get(URL).status_code == 403
    assert callbacks == [] and not NodeDrain.objects.exists()
    assert Allocation.objects.get().gpu.node.name == "gpu-a"


def test_operator_starts_a_drain_enqueued_after_commit_and_follows_it(sim, api, django_capture_on_commit_callbacks):
    reserve("gpu-a", 0)
    with django_capture_on_commit_callbacks() as callbacks:
        response = api.post(URL, {"node": node_pk("gpu-a"), "reason": "driver 570", "grace_s": 0}, format="json")
    assert response.status_code == 201, response.data
    assert len(callbacks) == 1
    body = response.json()
    assert (body["node_name"], body["step"], body["state"], body["grace_s"]) == ("gpu-a", "check", "pending", 0)

    drive(NodeDrain.objects.get(pk=body["id"]))
    body = api.get(f"{URL}{body['id']}/").json()
    assert (body["step"], body["phase"]) == ("handover", "in maintenance")
    assert len(body["moves"]) == 1 and body["moves"][0]["from"] == "gpu-a/0"
    assert api.post(f"{URL}{body['id']}/give-back/").json()["give_back_at"] is not None
    assert api.post(f"{URL}{body['id']}/give-back/").status_code == 409
    assert api.post(f"{URL}{body['id']}/resume/").status_code == 409


def test_a_refusal_is_409_with_the_shortfall(sim, api):
    for n in ("gpu-a", "gpu-b", "gpu-c"):
        reserve(n, 0)
        reserve(n, 4)
    response = api.post(URL, {"node": node_pk("gpu-a")}, format="json")
    assert response.status_code == 409
    assert response.json()["shortfall"] == {"H100-80GB 3g.40gb": 2}
    assert not NodeDrain.objects.exists()


def test_bad_input_is_400_with_field_messages(sim, api):
    response = api.post(URL, {"node": 999999, "grace_s": -1, "extra": 1}, format="json")
    assert response.status_code == 400
    assert {"node", "grace_s"} <= set(response.json())
