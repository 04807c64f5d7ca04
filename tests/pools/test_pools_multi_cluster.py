"""Pools across clusters (PoolRequest.allow_multi_cluster): approved across two simulated clusters only when the
request allows it, provisioned and reconciled per cluster, released and billed as one pool."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.urls import reverse
from pool_world import kube_for, run_concurrently

from billing import services as billing
from capacity.adapters.kubernetes import NotFound
from capacity.choices import Binding
from capacity.models import Cluster
from pools import services, units
from pools.choices import QueueAction, RequestState
from pools.exceptions import InsufficientCapacity
from pools.models import Allocation, AutoApprovalPolicy, GpuPool, PoolCluster, QueueEvent
from pools.provisioning import reconcile_provisioned, uuid_selector
from pools.tasks import deprovision_pool_task, provision_pool_task
from scheduling import forecast, queue

pytestmark = pytest.mark.django_db

# east: one node of 2 H100s, west: one of 1, every GPU carved into 2 x 3g.40gb: 4 units on east, 2 on west.
TWO_CLUSTERS = {
    "name": "two-clusters",
    "seed": 7,
    "clusters": [
        {
            "name": name,
            "node_groups": [
                {
                    "name_prefix": f"{name}-h100",
                    "count": 1,
                    "product": "H100-80GB",
                    "gpus_per_node": gpus,
                    "mig_strategy": "mixed",
                    "mig_layout": "all-3g.40gb",
                    "tier": "1",
                }
            ],
        }
        for name, gpus in (("east", 2), ("west", 1))
    ],
}
MIG = "requests.nvidia.com/mig-3g.40gb"


def serve(document: dict, tmp_path):
    """The scenario's clusters served by one SimServer, registered and discovered; `.clusters[name]` is the Cluster."""
    from capacity.services.clusters import register_cluster
    from capacity.services.discovery import discover_cluster
    from simcluster import SimServer
    from simcluster.scenarios import Scenario

    with SimServer(Scenario.from_dict(document).build()) as server:
        server.clusters = {}
        for name, path in server.write_kubeconfigs(tmp_path).items():
            cluster, _ = register_cluster(name, path)
            run = discover_cluster(cluster.pk, inventory="inline").run
            assert run.status == "succeeded", run.error
            server.clusters[name] = cluster
        yield server


@pytest.fixture
def two(db, tmp_path, settings):
    settings.KUBERNETES_RETRIES = 0
    yield from serve(TWO_CLUSTERS, tmp_path)


@pytest.fixture
def two_dra(db, tmp_path, settings):
    """The same two clusters, both binding by DRA (NVIDIA's DRA driver instead of the device plugin)."""
    settings.KUBERNETES_RETRIES = 0
    document = {**TWO_CLUSTERS, "clusters": [{**c, "dra": True} for c in TWO_CLUSTERS["clusters"]]}
    yield from serve(document, tmp_path)


def units_by_cluster(pool) -> dict[str, int]:
    rows = Allocation.objects.active().filter(pool=pool).values_list("gpu__node__cluster__name", flat=True)
    found: dict[str, int] = {}
    for name in rows:
        found[name] = found.get(name, 0) + 1
    return found


def quota(cluster, pool) -> dict | None:
    with kube_for(cluster) as kube:
        try:
            return kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]
        except NotFound:
            return None


def labelled(cluster, key: str) -> list[str]:
    with kube_for(cluster) as kube:
        return sorted(n.name for n in kube.list_nodes() if n.labels.get(key) == "true")


def test_a_request_larger_than_any_cluster_is_refused_unless_it_allows_several(two, make_request, operator):
    request = make_request(count=5)
    with pytest.raises(InsufficientCapacity) as refused:
        services.approve(request, actor=operator)
    assert refused.value.message.startswith(
        "need 5 x H100-80GB 3g.40gb on one cluster, at most 4 free on one (east), 6 free in all"
    )
    request.refresh_from_db()
    assert request.state == RequestState.SUBMITTED
    assert not GpuPool.objects.exists() and not Allocation.objects.exists() and not PoolCluster.objects.exists()

    waiting = make_request(count=5, wait_if_full=True)
    assert queue.approve_or_queue(waiting, actor=operator) is None
    waiting.refresh_from_db()
    assert waiting.state == RequestState.QUEUED
    assert waiting.state_reason.startswith("queued: need 5 x H100-80GB 3g.40gb on one cluster, at most 4 free")


def test_a_request_one_cluster_can_hold_stays_on_one_even_when_it_allows_several(two, make_request, operator):
    pool = services.approve(make_request(count=2, allow_multi_cluster=True), actor=operator)
    assert units_by_cluster(pool) == {"west": 2}  # best fit, as without the flag
    assert list(pool.pool_clusters.values_list("cluster__name", "units")) == [("west", 2)]
    assert pool.clusters() == [two.clusters["west"]]


def test_a_cross_cluster_pool_is_provisioned_released_and_cleaned_up_on_every_cluster(
    two, make_request, operator, alice, project, django_capture_on_commit_callbacks
):
    east, west = two.clusters["east"], two.clusters["west"]
    request = make_request(count=5, allow_multi_cluster=True)
    pool = services.approve(request, actor=operator)

    assert pool.cluster == east  # home: the cluster with the most units
    assert units_by_cluster(pool) == {"east": 4, "west": 1}
    assert list(pool.pool_clusters.order_by("pk").values_list("cluster__name", "units")) == [("east", 4), ("west", 1)]
    assert pool.clusters() == [east, west]
    request.refresh_from_db()
    assert request.state_reason == "5 units on east (4), west (1); provisioning"
    assert Allocation.objects.active().values("mig_instance").distinct().count() == 5

    assert provision_pool_task(pool.pk) == "active"
    pool.refresh_from_db()
    assert (pool.state, pool.attempts, pool.provisioned_at is not None) == ("active", 1, True)
    assert all(part.provisioned_at and not part.error for part in pool.pool_clusters.all())
    zeroes = {"requests.nvidia.com/gpu": "0"}
    assert quota(east, pool) == {**zeroes, MIG: "4"}
    assert quota(west, pool) == {**zeroes, MIG: "1"}
    for cluster in (east, west):
        with kube_for(cluster) as kube:
            annotations = kube.get_namespace("team-a")["metadata"]["annotations"]
            assert annotations["scheduler.alpha.kubernetes.io/node-selector"] == f"gpuaas.io/project-{project.pk}=true"
            assert kube.get_config_map("team-a", f"gpuaas-pool-{pool.pk}") is not None
        assert labelled(cluster, f"gpuaas.io/pool-{pool.pk}") == [f"{cluster.name}-h100-01"]

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.release(request, actor=alice, reason="done")
    assert [(cb.func.__self__.name, cb.args) for cb in callbacks] == [
        ("pools.tasks.deprovision_pool_task", (pool.pk,)),
        ("pools.tasks.process_queue_task", ()),
    ]
    assert not Allocation.objects.active().exists()
    assert units.free_by_cluster(make_request(count=1)) == {east.pk: 4, west.pk: 2}
    assert deprovision_pool_task(pool.pk) is True
    pool.refresh_from_db()
    assert (pool.state, pool.deprovisioned_at is not None) == ("released", True)
    assert all(part.deprovisioned_at for part in pool.pool_clusters.all())
    for cluster in (east, west):
        assert quota(cluster, pool) is None
        assert labelled(cluster, f"gpuaas.io/pool-{pool.pk}") == []
        assert labelled(cluster, f"gpuaas.io/project-{project.pk}") == []
    assert deprovision_pool_task(pool.pk) is None  # already clean


def test_on_dra_clusters_each_cluster_gets_a_claim_template_admitting_only_its_own_units(
    two_dra, make_request, operator
):
    pool = services.approve(make_request(count=5, allow_multi_cluster=True), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    assert pool.claim_template == f"gpuaas-{pool.pk}-mig-3g.40gb"
    for name, count in (("east", 4), ("west", 1)):
        cluster = two_dra.clusters[name]
        uuids = Allocation.objects.filter(pool=pool, gpu__node__cluster=cluster).values_list(
            "mig_instance__uuid", flat=True
        )
        assert len(uuids) == count
        with kube_for(cluster) as kube:
            (template,) = kube.list_resource_claim_templates("team-a")
        assert template["metadata"]["name"] == pool.claim_template
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["selectors"][0]["cel"]["expression"] == uuid_selector(list(uuids))


def test_a_failure_on_one_cluster_fails_the_pool_naming_it_and_retry_recovers(two, make_request, operator, alice):
    east, west = two.clusters["east"], two.clusters["west"]
    two.state.faults.api_error(
        1, status=500, cluster="west", method="POST", path_prefix="/api/v1/namespaces/team-a/resourcequotas"
    )
    pool = services.approve(make_request(count=6, allow_multi_cluster=True), actor=operator)
    assert provision_pool_task(pool.pk) == "failed"
    pool.refresh_from_db()
    assert pool.state_reason.startswith("Kubernetes (west): create_namespaced_resource_quota on ")
    parts = {p.cluster.name: p for p in pool.pool_clusters.select_related("cluster")}
    assert parts["east"].provisioned_at is not None and parts["east"].error == ""
    assert parts["west"].provisioned_at is None and "500" in parts["west"].error

    services.retry_provisioning(pool, actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    assert (quota(east, pool)[MIG], quota(west, pool)[MIG]) == ("4", "2")
    assert PoolCluster.objects.get(pool=pool, cluster=west).error == ""

    # Clean-up that fails on one cluster keeps the pool waiting for it, and the other cluster is done.
    services.release(pool.request, actor=alice)
    two.state.faults.api_error(1, status=500, cluster="west", method="DELETE")
    assert deprovision_pool_task(pool.pk) is False
    pool.refresh_from_db()
    assert pool.deprovisioned_at is None
    assert pool.state_reason.startswith("clean-up on west failed, will retry: ")
    assert PoolCluster.objects.get(pool=pool, cluster=east).deprovisioned_at is not None
    assert list(services.pools_awaiting_cleanup(older_than_s=0)) == [pool]
    assert deprovision_pool_task(pool.pk) is True
    assert quota(west, pool) is None


def test_reconcile_repairs_each_cluster_of_the_pool(two, make_request, operator):
    east, west = two.clusters["east"], two.clusters["west"]
    pool = services.approve(make_request(count=5, allow_multi_cluster=True), actor=operator)
    provision_pool_task(pool.pk)
    with kube_for(west) as kube:
        kube.delete_resource_quota("team-a", f"gpuaas-{pool.pk}")

    result = reconcile_provisioned()

    assert result == {"clusters": 2, "projects": 2, "repaired": 1, "errors": 0}
    assert quota(west, pool) == {"requests.nvidia.com/gpu": "0", MIG: "1"}
    assert quota(east, pool)[MIG] == "4"
    assert all(part.reconciled_at for part in pool.pool_clusters.all())
    assert (
        pool.request.transitions.last().reason == f"reconcile repaired drift: quota team-a/gpuaas-{pool.pk} recreated"
    )


def test_the_queue_approves_a_waiting_request_across_clusters_when_units_free(two, make_request, operator, alice):
    AutoApprovalPolicy.objects.create(name="all")
    holder = services.approve(make_request(count=3), actor=operator)  # 3 of east's 4
    waiting = make_request(count=5, allow_multi_cluster=True, wait_if_full=True)
    queue.after_submit(waiting)
    waiting.refresh_from_db()
    assert waiting.state == RequestState.QUEUED
    assert waiting.state_reason.startswith("queued: need 5 x H100-80GB 3g.40gb across clusters, 3 free in all")
    assert not queue.fits_now(waiting)

    services.release(holder.request, actor=alice)
    result = queue.process()

    assert result.approved == [waiting.pk]
    pool = GpuPool.objects.get(request=waiting)
    assert units_by_cluster(pool) == {"east": 4, "west": 1}
    assert QueueEvent.objects.filter(request=waiting, action=QueueAction.AUTO_APPROVED).count() == 1


def test_clusters_of_different_bindings_are_not_combined(fleet, make_request, operator):
    fleet.mig_node("a1", [["3g.40gb", "3g.40gb"]], cluster="c1")
    fleet.mig_node("b1", [["3g.40gb", "3g.40gb"]], cluster="c2")
    Cluster.objects.filter(name="c2").update(binding=Binding.DRA)
    request = make_request(count=3, allow_multi_cluster=True)
    assert not queue.fits_now(request)
    with pytest.raises(InsufficientCapacity) as refused:
        services.approve(request, actor=operator)
    assert refused.value.message.startswith(
        "need 3 x H100-80GB 3g.40gb across clusters, 2 free on clusters of one binding, 4 in all"
    )
    assert not Allocation.objects.exists()


def test_a_cross_cluster_pool_is_billed_as_one_pool(two, make_request, operator, project):
    pool = services.approve(make_request(count=5, allow_multi_cluster=True), actor=operator)
    provision_pool_task(pool.pk)
    start, end = datetime(2026, 3, 10, 10, tzinfo=UTC), datetime(2026, 3, 10, 12, tzinfo=UTC)
    Allocation.objects.filter(pool=pool).update(allocated_at=start, released_at=end)
    GpuPool.objects.filter(pk=pool.pk).update(provisioned_at=start)

    billing.meter_usage(now=datetime(2026, 3, 10, 13, tzinfo=UTC))
    statement = billing.generate_statement(project, date(2026, 3, 1))

    lines = list(statement.lines.values_list("pool_id", "hours", "hourly_rate", "amount"))
    # 5 units (4 on east, 1 on west) x 2 h, at the 3g.40gb rate: one line, as for a pool on one cluster.
    assert lines == [(pool.pk, Decimal("10.0000"), Decimal("1.250000"), Decimal("12.50"))]
    assert statement.reserved_hours == Decimal("10.0000")


# Threads need committed rows; the MIG catalog comes back after each flush (post_migrate).
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_multi_cluster_approvals_racing_for_the_same_units_never_share_one(fleet, make_request, operator):
    fleet.mig_node("a1", [["3g.40gb", "3g.40gb"]] * 2, cluster="c1")  # 4 units
    fleet.mig_node("b1", [["3g.40gb", "3g.40gb"]] * 2, cluster="c2")  # 4 units
    requests = [make_request(count=5, allow_multi_cluster=True) for _ in range(4)]  # any one fits, never two
    outcomes = run_concurrently([lambda r=r: services.approve(r, actor=operator) for r in requests])
    assert Counter(type(o).__name__ for o in outcomes) == {"GpuPool": 1, "InsufficientCapacity": 3}
    (pool,) = [o for o in outcomes if isinstance(o, GpuPool)]
    active = Allocation.objects.active()
    assert active.count() == 5 and active.values("mig_instance").distinct().count() == 5
    assert set(active.values_list("pool", flat=True)) == {pool.pk}
    assert sorted(PoolCluster.objects.values_list("cluster__name", "units")) == [("c1", 4), ("c2", 1)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_many_spanning_approvals_at_once_take_each_unit_at_most_once(fleet, make_request, operator):
    for name in ("c1", "c2", "c3"):
        fleet.mig_node(f"{name}-n", [["3g.40gb", "3g.40gb"]], cluster=name)  # 2 units each, 6 in all
    requests = [make_request(count=3, allow_multi_cluster=True) for _ in range(6)]  # none fits on one cluster
    outcomes = run_concurrently([lambda r=r: services.approve(r, actor=operator) for r in requests])
    assert Counter(type(o).__name__ for o in outcomes) == {"GpuPool": 2, "InsufficientCapacity": 4}
    pools = [o for o in outcomes if isinstance(o, GpuPool)]
    active = Allocation.objects.active()
    assert active.count() == 3 * len(pools) == active.values("mig_instance").distinct().count()
    for pool in pools:
        assert active.filter(pool=pool).count() == 3
        assert pool.pool_clusters.count() == 2  # 2 + 1: the fewest clusters
    refused = [r.pk for r, o in zip(requests, outcomes, strict=True) if isinstance(o, InsufficientCapacity)]
    assert not Allocation.objects.filter(pool__request__in=refused).exists()


@pytest.fixture
def spanning_pool(fleet, make_request, operator):
    """A pool of 5 x 3g.40gb across c1 (4 units) and c2 (1 of its 2), from ORM rows (no simulator)."""
    fleet.mig_node("a1", [["3g.40gb", "3g.40gb"]] * 2, cluster="c1")
    fleet.mig_node("b1", [["3g.40gb", "3g.40gb"]], cluster="c2")
    return services.approve(make_request(count=5, allow_multi_cluster=True), actor=operator)


def test_the_api_shows_the_pool_once_with_its_clusters_and_units_per_cluster(spanning_pool, fleet, api, bob):
    c1, c2 = fleet.clusters["c1"], fleet.clusters["c2"]
    listed = api(bob).get("/api/v1/pools/")
    assert listed.status_code == 200
    assert [p["id"] for p in listed.data["results"]] == [spanning_pool.pk]
    pool = listed.data["results"][0]
    assert (pool["cluster_name"], pool["profiles_total"]) == ("c1", 5)
    assert [(c["cluster"], c["cluster_name"], c["units"], c["error"]) for c in pool["clusters"]] == [
        (c1.pk, "c1", 4, ""),
        (c2.pk, "c2", 1, ""),
    ]
    assert pool["clusters"][0]["provisioned_at"] is None  # not provisioned yet
    # Listed under either cluster, not only its home one.
    for cluster in (c1, c2):
        assert [p["id"] for p in api(bob).get("/api/v1/pools/", {"cluster": cluster.pk}).data["results"]] == [
            spanning_pool.pk
        ]


def test_the_admin_shows_units_per_cluster(spanning_pool, client, operator):
    client.force_login(operator)
    page = client.get(reverse("admin:pools_gpupool_changelist"))
    assert page.status_code == 200
    assert "c1 4, c2 1" in page.content.decode()
    detail = client.get(reverse("admin:pools_gpupool_change", args=[spanning_pool.pk]))
    assert detail.status_code == 200
    inline = next(f for f in detail.context["inline_admin_formsets"] if f.opts.model is PoolCluster)
    assert [(form.original.cluster.name, form.original.units_held) for form in inline] == [("c1", 4), ("c2", 1)]


def test_the_forecast_counts_a_spanning_pools_units_on_the_cluster_they_are_on(two, make_request, operator):
    """A pool homed on east holds units on west too: a request for west waits for those (scheduling.forecast)."""
    pool = services.approve(make_request(count=5, allow_multi_cluster=True), actor=operator)
    assert units_by_cluster(pool) == {"east": 4, "west": 1}
    west = make_request(count=2, cluster=two.clusters["west"])
    found, _ = forecast.holders(west, now=pool.created_at)
    assert [h.units for h in found] == [1]  # the spanning pool's one unit on west, not its four on east
