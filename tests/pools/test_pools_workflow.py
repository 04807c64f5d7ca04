"""The whole workflow against the simulator, through the API with personal tokens:
token -> request -> approval -> provisioning -> card -> release -> clean-up, and expiry."""

import datetime as dt

import pytest
from pool_world import kube_for
from rest_framework.test import APIClient

from capacity.adapters.kubernetes import NotFound
from pools.models import Allocation, PoolRequest
from pools.tasks import deprovision_pool_task, expire_requests_task, provision_pool_task

pytestmark = pytest.mark.django_db


def token_client(api, user):
    key = api(user).post("/api/v1/tokens/", {"name": "cli"}).data["key"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_request_approve_provision_release(sim, api, project, alice, bob, operator, django_capture_on_commit_callbacks):
    bob_cli, alice_cli, ops_cli = (token_client(api, u) for u in (bob, alice, operator))
    created = bob_cli.post(
        "/api/v1/pool-requests/",
        {"project": project.pk, "isolation": "full", "count": 2, "justification": "fine-tuning", "submit": True},
        format="json",
    )
    assert created.status_code == 201, created.data
    assert (created.data["state"], created.data["tier"], created.data["spec"]) == ("submitted", "full", "full GPU")
    request_id = created.data["id"]

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        approved = ops_cli.post(f"/api/v1/pool-requests/{request_id}/approve/", {"reason": "training quarter"})
    assert approved.status_code == 200, approved.data
    pool_id = approved.data["pool"]
    pools_tasks = [(cb.func.__self__.name, cb.args) for cb in callbacks if cb.func.__self__.name.startswith("pools.")]
    assert pools_tasks == [("pools.tasks.provision_pool_task", (pool_id,))]
    assert provision_pool_task(pool_id) == "active"

    card = bob_cli.get(f"/api/v1/pools/{pool_id}/").data
    assert (card["state"], card["total_gpus"], card["profiles_total"], card["allocation"], card["tier"]) == (
        "active",
        2,
        2,
        "0/2",
        "full",
    )
    units = bob_cli.get("/api/v1/allocations/", {"pool": pool_id}).data["results"]
    assert {(u["kind"], u["cluster"], u["resource_name"]) for u in units} == {("full", "prod", "nvidia.com/gpu")}
    nodes = {u["node"] for u in units}
    prod = sim.clusters["prod"]
    with kube_for(prod) as kube:
        hard = kube.get_resource_quota("team-a", f"gpuaas-{pool_id}")["spec"]["hard"]
        assert hard["requests.nvidia.com/gpu"] == "2"
        assert {n.name for n in kube.list_nodes() if n.labels.get(f"gpuaas.io/pool-{pool_id}") == "true"} == nodes

    assert bob_cli.post(f"/api/v1/pool-requests/{request_id}/release/").status_code == 403
    released = alice_cli.post(f"/api/v1/pool-requests/{request_id}/release/", {"reason": "done"})
    assert (released.status_code, released.data["state"]) == (200, "released")
    assert not Allocation.objects.active().filter(pool_id=pool_id).exists()
    assert deprovision_pool_task(pool_id) is True
    with kube_for(prod) as kube:
        with pytest.raises(NotFound):
            kube.get_resource_quota("team-a", f"gpuaas-{pool_id}")
        assert not [n.name for n in kube.list_nodes() if f"gpuaas.io/pool-{pool_id}" in n.labels]
    states = [t["to_state"] for t in bob_cli.get(f"/api/v1/pool-requests/{request_id}/").data["transitions"]]
    assert states == ["submitted", "approved", "provisioning", "active", "released"]


def test_expiry_releases_after_notice(sim, api, project, bob, operator, settings):
    settings.POOL_EXPIRY_NOTICE_S = 0
    end = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).isoformat()
    created = token_client(api, bob).post(
        "/api/v1/pool-requests/",
        {"project": project.pk, "tier": "3", "count": 3, "end_at": end, "submit": True},
        format="json",
    )
    assert (created.data["isolation"], created.data["tier"]) == ("timeslice", "3")
    approved = token_client(api, operator).post(f"/api/v1/pool-requests/{created.data['id']}/approve/")
    assert approved.status_code == 200, approved.data
    pool_id = approved.data["pool"]
    assert provision_pool_task(pool_id) == "active"
    assert Allocation.objects.get(pool_id=pool_id, replica=0).gpu.node.cluster.name == "dev"
    PoolRequest.objects.filter(pk=created.data["id"]).update(end_at=dt.datetime.now(dt.UTC))
    assert expire_requests_task() == {"noticed": 1, "expired": 1, "cleanups_enqueued": 0}
    assert PoolRequest.objects.get(pk=created.data["id"]).state == "expired"
    assert deprovision_pool_task(pool_id) is True
    with kube_for(sim.clusters["dev"]) as kube:
        with pytest.raises(NotFound):
            kube.get_resource_quota("team-a", f"gpuaas-{pool_id}")
