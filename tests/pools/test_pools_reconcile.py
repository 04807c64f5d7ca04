"""Level-triggered reconcile: what provisioning wrote and someone (or a restart) removed is put back."""

import pytest
from pool_world import kube_for

from capacity.adapters.kubernetes import KubernetesClient, NotFound
from pools import services
from pools.models import Allocation, PoolRequestTransition
from pools.provisioning import reconcile_provisioned
from pools.tasks import provision_pool_task, reconcile_pools_task

pytestmark = pytest.mark.django_db

WRITES = ("ensure_namespace", "patch_namespace", "apply_resource_quota", "delete_resource_quota", "patch_node_labels")


def spying(writes: list):
    """A client factory that records every write call (method, first argument)."""

    def factory(cluster):
        client = KubernetesClient.for_cluster(cluster)
        for name in WRITES:
            method = getattr(client, name)
            setattr(client, name, lambda *a, _m=method, _n=name, **kw: (writes.append((_n, a[0])), _m(*a, **kw))[1])
        return client

    return factory


@pytest.fixture
def provisioned(sim, make_request, operator):
    pool = services.approve(make_request(count=2), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    pool.refresh_from_db()
    return pool


def node_of(pool):
    return Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True).first()


def test_nothing_drifted_nothing_written(sim, provisioned):
    writes = []
    assert reconcile_provisioned(client_factory=spying(writes)) == {
        "clusters": 1,
        "projects": 1,
        "repaired": 0,
        "errors": 0,
    }
    assert writes == []
    provisioned.refresh_from_db()
    assert provisioned.reconciled_at is not None
    assert not PoolRequestTransition.objects.filter(reason__startswith="reconcile").exists()


def test_deleted_quota_and_labels_and_edited_namespace_are_restored(sim, provisioned, project):
    prod, pool, node = sim.clusters["prod"], provisioned, node_of(provisioned)
    pool_label, project_label = f"gpuaas.io/pool-{pool.pk}", f"gpuaas.io/project-{project.pk}"
    with kube_for(prod) as kube:  # what a restarted cluster (or a careless operator) leaves behind
        kube.delete_resource_quota("team-a", f"gpuaas-{pool.pk}")
        kube.patch_node_labels(node, {pool_label: None, project_label: None})
        kube.patch_namespace("team-a", annotations={"scheduler.alpha.kubernetes.io/node-selector": "anything=true"})

    writes = []
    result = reconcile_provisioned(client_factory=spying(writes))

    assert result == {"clusters": 1, "projects": 1, "repaired": 3, "errors": 0}
    assert writes == [
        ("patch_namespace", "team-a"),
        ("apply_resource_quota", "team-a"),
        ("patch_node_labels", node),
    ]
    with kube_for(prod) as kube:
        hard = kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]
        assert hard["requests.nvidia.com/mig-3g.40gb"] == "2"
        labels = kube.get_node(node).labels
        assert (labels[pool_label], labels[project_label]) == ("true", "true")
        annotations = kube.get_namespace("team-a")["metadata"]["annotations"]
        assert annotations["scheduler.alpha.kubernetes.io/node-selector"] == f"{project_label}=true"
    audit = PoolRequestTransition.objects.filter(request=pool.request, reason__startswith="reconcile").get()
    assert (audit.from_state, audit.to_state) == ("active", "active")
    assert audit.reason == (
        "reconcile repaired drift: namespace team-a: node selector, tolerations and labels restored; "
        f"quota team-a/gpuaas-{pool.pk} recreated; node {node}: labels {pool_label}, {project_label} restored"
    )

    # Repaired: the next pass finds nothing to do.
    writes.clear()
    assert reconcile_provisioned(client_factory=spying(writes))["repaired"] == 0
    assert writes == []


def test_a_deleted_namespace_is_recreated_with_its_quota(sim, provisioned):
    prod = sim.clusters["prod"]
    with kube_for(prod) as kube:
        kube._call(kube.core.delete_namespace, "team-a")
        with pytest.raises(NotFound):
            kube.get_namespace("team-a")

    assert reconcile_pools_task() == {"clusters": 1, "projects": 1, "repaired": 2, "errors": 0}
    with kube_for(prod) as kube:
        assert kube.get_namespace("team-a")["metadata"]["name"] == "team-a"
        assert kube.get_resource_quota("team-a", f"gpuaas-{provisioned.pk}")["spec"]["hard"]


def test_provisioning_and_released_pools_are_not_reconciled(sim, make_request, operator, alice):
    pool = services.approve(make_request(count=2), actor=operator)  # still provisioning
    assert reconcile_provisioned() == {"clusters": 0, "projects": 0, "repaired": 0, "errors": 0}
    assert provision_pool_task(pool.pk) == "active"
    services.release(pool.request, actor=alice)
    assert reconcile_provisioned() == {"clusters": 0, "projects": 0, "repaired": 0, "errors": 0}


def test_an_unreachable_cluster_is_counted_and_changes_nothing(sim, provisioned):
    def broken(cluster):
        from capacity.adapters.kubernetes import Unavailable

        raise Unavailable("connection refused")

    assert reconcile_provisioned(client_factory=broken) == {"clusters": 0, "projects": 0, "repaired": 0, "errors": 1}
    provisioned.refresh_from_db()
    assert provisioned.reconciled_at is None
    assert not PoolRequestTransition.objects.filter(reason__startswith="reconcile").exists()
