"""Provisioning against the simulator: namespace, quota and node labels; failure, retry, release, idempotency."""

import json
import urllib.error
import urllib.request

import pytest
from pool_world import kube_for

from capacity.adapters.kubernetes import NotFound
from capacity.services.discovery import discover_cluster
from pools import services
from pools.models import Allocation, GpuPool
from pools.tasks import deprovision_pool_task, provision_pool_task

pytestmark = pytest.mark.django_db

QUOTA_ZEROES = {
    "requests.nvidia.com/gpu": "0",
    "requests.nvidia.com/mig-1g.10gb": "0",
    "requests.nvidia.com/mig-2g.20gb": "0",
}


def pool_nodes(pool):
    return sorted(set(Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True)))


def labelled(kube, key):
    return sorted(n.name for n in kube.list_nodes() if n.labels.get(key) == "true")


def test_provisioning_creates_namespace_quota_and_node_labels(sim, make_request, operator, project):
    prod = sim.clusters["prod"]
    pool = services.approve(make_request(count=2), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    pool.refresh_from_db()
    assert (pool.state, pool.attempts, pool.state_reason) == ("active", 1, "")
    assert pool.request.state == "active"
    assert pool.provisioned_at is not None
    with kube_for(prod) as kube:
        namespace = kube.get_namespace("team-a")
        assert namespace["metadata"]["annotations"]["scheduler.alpha.kubernetes.io/node-selector"] == (
            f"gpuaas.io/project-{project.pk}=true"
        )
        quota = kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")
        assert quota["spec"]["hard"] == {**QUOTA_ZEROES, "requests.nvidia.com/mig-3g.40gb": "2"}
        assert labelled(kube, f"gpuaas.io/pool-{pool.pk}") == pool_nodes(pool) == ["prod-h100-bal-01"]
        assert labelled(kube, f"gpuaas.io/project-{project.pk}") == ["prod-h100-bal-01"]
    # Idempotent: the task does nothing for a pool that is no longer provisioning.
    assert provision_pool_task(pool.pk) is None
    pool.refresh_from_db()
    assert pool.attempts == 1


def test_two_pools_in_one_namespace_each_carry_the_sum_and_release_reduces_it(
    sim, make_request, operator, alice, project, django_capture_on_commit_callbacks
):
    prod = sim.clusters["prod"]
    first = services.approve(make_request(count=2), actor=operator)
    second = services.approve(make_request(count=14), actor=operator)
    assert provision_pool_task(first.pk) == "active"
    assert provision_pool_task(second.pk) == "active"
    with kube_for(prod) as kube:
        for pool in (first, second):
            hard = kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]
            assert hard["requests.nvidia.com/mig-3g.40gb"] == "16"
        assert labelled(kube, f"gpuaas.io/project-{project.pk}") == ["prod-h100-bal-01", "prod-h100-bal-02"]

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.release(second.request, actor=alice, reason="done")
    assert [(cb.func.__self__.name, cb.args) for cb in callbacks] == [
        ("pools.tasks.deprovision_pool_task", (second.pk,)),
        ("pools.tasks.process_queue_task", ()),
    ]
    assert not Allocation.objects.active().filter(pool=second).exists()
    assert deprovision_pool_task(second.pk) is True
    second.refresh_from_db()
    assert (second.state, second.deprovisioned_at is not None) == ("released", True)
    with kube_for(prod) as kube:
        with pytest.raises(NotFound):
            kube.get_resource_quota("team-a", f"gpuaas-{second.pk}")
        hard = kube.get_resource_quota("team-a", f"gpuaas-{first.pk}")["spec"]["hard"]
        assert hard["requests.nvidia.com/mig-3g.40gb"] == "2"
        assert labelled(kube, f"gpuaas.io/pool-{second.pk}") == []
        assert labelled(kube, f"gpuaas.io/project-{project.pk}") == ["prod-h100-bal-01"]
    assert deprovision_pool_task(second.pk) is None  # already clean


def test_a_kubernetes_failure_fails_the_pool_and_retry_recovers(
    sim, make_request, operator, api, django_capture_on_commit_callbacks
):
    sim.state.faults.api_error(
        1, status=500, cluster="prod", method="POST", path_prefix="/api/v1/namespaces/team-a/resourcequotas"
    )
    pool = services.approve(make_request(count=1), actor=operator)
    assert provision_pool_task(pool.pk) == "failed"
    pool.refresh_from_db()
    assert pool.state == "failed"
    assert pool.state_reason.startswith("Kubernetes: create_namespaced_resource_quota on ")
    assert "500" in pool.state_reason
    assert (pool.request.state, pool.request.state_reason) == ("failed", pool.state_reason)
    assert Allocation.objects.active().filter(pool=pool).count() == 1  # the units stay held

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api(operator).post(f"/api/v1/pools/{pool.pk}/retry/")
    assert response.status_code == 200, response.data
    assert response.data["state"] == "provisioning"
    assert [(cb.func.__self__.name, cb.args) for cb in callbacks] == [("pools.tasks.provision_pool_task", (pool.pk,))]
    assert provision_pool_task(pool.pk) == "active"
    pool.refresh_from_db()
    assert (pool.state, pool.attempts, pool.request.state) == ("active", 2, "active")
    assert list(pool.request.transitions.values_list("to_state", flat=True)) == [
        "submitted",
        "approved",
        "provisioning",
        "failed",
        "provisioning",
        "active",
    ]


def test_a_failed_clean_up_is_kept_and_retried(sim, make_request, operator, alice):
    pool = services.approve(make_request(count=1), actor=operator)
    provision_pool_task(pool.pk)
    services.release(pool.request, actor=alice)
    sim.state.faults.api_error(1, status=500, cluster="prod", method="DELETE")
    assert deprovision_pool_task(pool.pk) is False
    pool.refresh_from_db()
    assert pool.deprovisioned_at is None
    assert pool.state_reason.startswith("clean-up failed, will retry: ")
    assert list(services.pools_awaiting_cleanup(older_than_s=0)) == [pool]
    assert deprovision_pool_task(pool.pk) is True


def _create_pod(sim, name, count):
    body = {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.40gb": str(count)}}}
            ]
        },
    }
    request = urllib.request.Request(
        f"{sim.cluster_url('prod')}/api/v1/namespaces/team-a/pods",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer simcluster"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_projects_pods_land_on_its_nodes_within_its_quota_and_show_on_the_card(
    sim, make_request, operator, bob, api
):
    pool = services.approve(make_request(count=2), actor=operator)
    provision_pool_task(pool.pk)
    status, pod = _create_pod(sim, "infer", 1)
    assert status == 201
    status, refused = _create_pod(sim, "greedy", 2)
    assert status == 403
    assert "exceeded quota" in refused["message"]
    assert discover_cluster(sim.clusters["prod"].pk, inventory="inline").run.status == "succeeded"
    placed = sim.state.cluster("prod").pods[("team-a", "infer")].obj["spec"]["nodeName"]
    assert placed in pool_nodes(pool)
    card = api(bob).get(f"/api/v1/pools/{pool.pk}/").data
    assert (card["profiles_in_use"], card["profiles_total"], card["allocation"]) == (1, 2, "1/2")
    assert (card["gpus_touched_in_use"], card["gpus_touched"], card["utilisation"]) == (1, 2, None)
    assert GpuPool.objects.get(pk=pool.pk).card()["allocation"] == "1/2"


def test_a_unit_released_on_its_own_leaves_quota_and_node(sim, make_request, operator, project):
    from django.utils import timezone

    from pools.provisioning import reconcile

    pool = services.approve(make_request(count=9), actor=operator)
    provision_pool_task(pool.pk)
    assert pool_nodes(pool) == ["prod-h100-bal-01", "prod-h100-bal-02"]
    Allocation.objects.filter(pool=pool, gpu__node__name="prod-h100-bal-02").update(released_at=timezone.now())
    reconcile(project, pool.cluster)
    with kube_for(sim.clusters["prod"]) as kube:
        hard = kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]
        assert hard["requests.nvidia.com/mig-3g.40gb"] == "8"
        assert labelled(kube, f"gpuaas.io/pool-{pool.pk}") == ["prod-h100-bal-01"]
        assert labelled(kube, f"gpuaas.io/project-{project.pk}") == ["prod-h100-bal-01"]
