"""Operator API of rolling driver upgrades: who may start one, field errors, the ClusterPolicy's default,
progress with per-node detail and counts, pause/resume/cancel and give-back."""

import pytest
from rest_framework.test import APIClient
from upgrade_sim import NAMES, fleet, nodes, open_window, run

from capacity.models import NodeCapacity
from operations.models import DriverUpgrade

pytestmark = pytest.mark.django_db
URL = "/api/v1/driver-upgrades/"


@pytest.fixture
def sim(tmp_path, settings):
    settings.DRIVER_UPGRADE_POLL_S = 1
    settings.MAINTENANCE_GRACE_S = 0
    sim = fleet(tmp_path, names=NAMES)
    yield sim
    sim.server.stop()


@pytest.fixture
def api(operator):
    client = APIClient()
    client.force_authenticate(operator)
    return client


def pks(*names):
    return [n.pk for n in nodes(*names)]


@pytest.mark.parametrize("persona", ["alice", "bob", "charlie", "staff_nobody"])
def test_only_operators_start_or_read_rollouts(sim, request, persona, django_capture_on_commit_callbacks):
    user = request.getfixturevalue(persona)
    client = APIClient()
    assert client.post(URL, {"cluster": sim.cluster.pk}, format="json").status_code == 401
    client.force_authenticate(user)
    with django_capture_on_commit_callbacks() as callbacks:
        assert client.post(URL, {"cluster": sim.cluster.pk}, format="json").status_code == 403
    assert client.get(URL).status_code == 403
    assert callbacks == [] and not DriverUpgrade.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "cluster"),
        ({"max_parallel": 0}, "max_parallel"),
        ({"mode": "yolo"}, "mode"),
        ({"grace_s": -1}, "grace_s"),
        ({"node_group": "nowhere"}, "node_group"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(sim, api, body, field):
    body = {"cluster": sim.cluster.pk, **body} if field != "cluster" else body
    response = api.post(URL, body, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()
    assert not DriverUpgrade.objects.exists()


def test_nodes_of_another_cluster_or_already_in_a_rollout_are_refused(sim, api, tmp_path):
    other = fleet(tmp_path / "other", names=("gpu-x",))
    try:
        response = api.post(URL, {"cluster": sim.cluster.pk, "nodes": pks("gpu-x")}, format="json")
        assert response.status_code == 400 and "nodes" in response.json()
    finally:
        other.server.stop()
    assert api.post(URL, {"cluster": sim.cluster.pk, "nodes": pks("gpu-a")}, format="json").status_code == 201
    response = api.post(URL, {"cluster": sim.cluster.pk, "nodes": pks("gpu-a", "gpu-b")}, format="json")
    assert response.status_code == 400 and "gpu-a" in response.json()["nodes"][0]
    assert DriverUpgrade.objects.count() == 1


def test_max_parallel_and_mode_default_to_the_cluster_policy(sim, api):
    with sim.state.lock:
        from simcluster.kube import ClusterApi

        ClusterApi(sim.sim_cluster).create(
            "clusterpolicies",
            None,
            {
                "apiVersion": "nvidia.com/v1",
                "kind": "ClusterPolicy",
                "metadata": {"name": "cluster-policy"},
                "spec": {"driver": {"upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 3}}},
            },
        )
    body = api.post(URL, {"cluster": sim.cluster.pk}, format="json").json()
    assert (body["max_parallel"], body["max_parallel_source"], body["mode"]) == (
        3,
        "ClusterPolicy cluster-policy",
        "controller",
    )


def test_without_a_cluster_policy_the_setting_and_own_drain_apply(sim, api, settings):
    settings.DRIVER_UPGRADE_MAX_PARALLEL = 2
    body = api.post(URL, {"cluster": sim.cluster.pk}, format="json").json()
    assert (body["max_parallel"], body["mode"]) == (2, "own_drain")
    assert body["max_parallel_source"] == "setting DRIVER_UPGRADE_MAX_PARALLEL"


def test_operator_creates_follows_pauses_and_gives_back(sim, api, django_capture_on_commit_callbacks):
    open_window(sim.cluster)
    with django_capture_on_commit_callbacks() as callbacks:
        response = api.post(
            URL,
            {"cluster": sim.cluster.pk, "nodes": pks("gpu-a", "gpu-b"), "mode": "own_drain", "max_parallel": 1},
            format="json",
        )
    assert response.status_code == 201, response.json()
    assert len(callbacks) == 1  # the first tick, after commit
    body = response.json()
    assert (body["state"], body["nodes_total"], body["nodes_done"], body["failed_nodes"]) == ("pending", 2, 0, 0)
    assert [n["node_name"] for n in body["nodes"]] == ["gpu-a", "gpu-b"]
    upgrade = DriverUpgrade.objects.get(pk=body["id"])

    run(sim, upgrade, rounds=10)
    body = api.get(f"{URL}{upgrade.pk}/").json()
    assert (body["state"], body["current_wave"], body["nodes_in_flight"]) == ("running", 1, 1)
    assert body["nodes"][0]["state"] == "upgrading" and body["nodes"][0]["drain"]
    assert api.post(f"{URL}{upgrade.pk}/pause/").json()["state"] == "paused"
    assert api.post(f"{URL}{upgrade.pk}/pause/").status_code == 409
    node_b = NodeCapacity.objects.get(name="gpu-b").pk
    assert api.post(f"{URL}{upgrade.pk}/give-back/", {"node": node_b}, format="json").status_code == 409
    gpu_a = body["nodes"][0]["node"]
    assert api.post(f"{URL}{upgrade.pk}/give-back/", {"node": gpu_a}, format="json").status_code == 200
    run(sim, upgrade, rounds=10)
    body = api.get(f"{URL}{upgrade.pk}/").json()
    assert (body["state"], body["nodes_done"], body["current_wave"]) == ("paused", 1, 1)  # no new wave
    assert api.post(f"{URL}{upgrade.pk}/resume/").json()["state"] == "running"
    assert api.post(f"{URL}{upgrade.pk}/cancel/").json()["state"] == "cancelled"
    assert api.post(f"{URL}{upgrade.pk}/cancel/").status_code == 409
    listed = api.get(URL, {"state": "cancelled"}).json()
    assert [r["id"] for r in listed["results"]] == [upgrade.pk]
