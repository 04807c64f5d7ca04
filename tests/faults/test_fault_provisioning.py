"""kill -9 of the worker at each step of provisioning: the sweep brings it back, the pool ends active."""

import pytest
from conftest import drive

from capacity.adapters.kubernetes import KubernetesClient
from pools import services
from pools.models import Allocation, PoolRequestTransition

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

STEPS = ["provisioning.claimed", "provisioning.quotas", "provisioning.reconciled"]


@pytest.fixture
def prod(tmp_path, settings):
    from capacity.services.clusters import register_cluster
    from capacity.services.discovery import discover_cluster
    from simcluster import SimServer, load_scenario

    settings.KUBERNETES_RETRIES = 0
    with SimServer(load_scenario("demo").build()) as server:
        path = server.write_kubeconfigs(tmp_path)["prod"]
        cluster, _ = register_cluster("prod", path)
        assert discover_cluster(cluster.pk, inventory="inline").run.status == "succeeded"
        yield cluster


def test_provisioning_survives_a_kill_at_every_step(prod, workers, project, operator):
    fleet = workers(["default"], STEPS)
    spec = services.resolve_spec(product="H100-80GB", profile_name="3g.40gb")
    request = services.create_request(
        project,
        actor=operator,
        submit=True,
        count=2,
        isolation=spec.isolation,
        tier=spec.tier,
        spec_kind=spec.spec_kind,
        product=spec.product,
        profile_name=spec.profile_name,
    )
    pool = services.approve(request, actor=operator)  # provisioning is enqueued on commit

    def done():
        pool.refresh_from_db()
        return pool.state != "provisioning"

    assert drive(fleet, done, services.sweep_provisioning), fleet.log_tail()

    assert fleet.crashed() == sorted(STEPS)
    assert fleet.killed() == [-9, -9, -9]
    assert (pool.state, pool.attempts, pool.claimed_by, pool.lease_expires_at) == ("active", 4, "", None)
    # Each dead worker's claim was taken over by a re-sent message (or a queued duplicate, which may
    # claim a lapsed lease too): one attempt per kill plus the one that finished.
    lost = PoolRequestTransition.objects.filter(request=pool.request, reason__startswith="provisioning re-queued")
    assert lost.exists()
    assert Allocation.objects.filter(pool=pool, released_at__isnull=True).count() == 2
    nodes = sorted(set(Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True)))
    with KubernetesClient.for_cluster(prod) as kube:
        hard = kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]
        labelled = sorted(n.name for n in kube.list_nodes() if n.labels.get(f"gpuaas.io/pool-{pool.pk}") == "true")
    assert hard["requests.nvidia.com/mig-3g.40gb"] == "2"
    assert labelled == nodes
