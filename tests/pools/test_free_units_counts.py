"""Free units (pools/units/free.py, #32): what read_free counts per cluster for every kind of unit, the capped
count approval chooses a cluster from, and which clusters a request may take from or span.

World: a spare cluster registered first (cluster, node, GPU and instance ids all differ), then east and west,
each with MIG, whole-GPU and time-slice nodes (and an MPS node on east); another project holds a MIG instance
on west and a replica on east, and a two-GPU pod runs on east. Requests are read back from the database, as
the queue and the API hand them over.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from capacity import picking
from capacity.choices import Binding, SharingStrategy, Tier
from capacity.models import Cluster, GpuCapacity, WorkloadProfile
from capacity.vgpu import VGPU_TYPES
from pools import services, units
from pools.models import PoolRequest

pytestmark = pytest.mark.django_db
THREE_THREE = ["3g.40gb", "3g.40gb"]
MIG = {"count": 1}
FULL = {"isolation": "full", "profile_name": "", "count": 1}
TIMESLICE = {"isolation": "timeslice", "profile_name": "", "count": 1}


def fresh(request: PoolRequest) -> PoolRequest:
    return PoolRequest.objects.get(pk=request.pk)


@pytest.fixture
def world(fleet, make_request, operator, other_project, charlie):
    fleet.cluster("spare")
    fleet.mig_node("east-mig", [THREE_THREE, THREE_THREE], cluster="east")
    train = fleet.full_node("east-train", gpus=3, cluster="east")
    fleet.timeslice_node("east-shared", gpus=1, replicas=4, cluster="east")
    mps = fleet.node(
        "east-mps", cluster="east", tier=Tier.DEVELOPMENT, replicas=4, sharing_strategy=SharingStrategy.MPS
    )
    fleet.gpu(mps, 0)
    fleet.mig_node("west-mig", [THREE_THREE], cluster="west")
    fleet.full_node("west-train", gpus=2, cluster="west")
    fleet.timeslice_node("west-shared", gpus=2, replicas=2, cluster="west")
    first, second, _ = GpuCapacity.objects.filter(node=train).order_by("index")
    WorkloadProfile.objects.create(
        cluster=train.cluster,
        namespace="ml",
        pod_name="trainer",
        pod_uid="uid-trainer",
        node=train,
        gpu=first,
        device_ids=[first.uuid, second.uuid],
        count=2,
        resource_name="nvidia.com/gpu",
    )
    west = fleet.cluster("west")
    services.approve(make_request(target=other_project, actor=charlie, **MIG), actor=operator, cluster=west)
    east = fleet.cluster("east")
    services.approve(make_request(target=other_project, actor=charlie, **TIMESLICE), actor=operator, cluster=east)
    return SimpleNamespace(east=east.pk, west=west.pk, busy=frozenset({first.uuid, second.uuid}))


def test_free_units_of_every_kind_per_cluster(world, make_request):
    east, west = world.east, world.west
    expected = [
        (MIG, {east: 4, west: 1}, world.busy),
        (FULL, {east: 1, west: 2}, world.busy),
        (TIMESLICE, {east: 3, west: 4}, None),
        ({"isolation": "mps", "profile_name": "", "count": 1}, {east: 4}, None),
    ]
    for fields, by_cluster, busy in expected:
        request = fresh(make_request(**fields))
        read = units.read_free(request)
        assert (read.by_cluster, read.busy_devices) == (by_cluster, busy), fields
        assert units.free_by_cluster(request) == by_cluster
        assert units.read_free_to_take(request).by_cluster == by_cluster  # all under the cap: exact
    pair = fresh(make_request(isolation="full", profile_name="", count=2))  # two whole GPUs: one node
    read = units.read_free(pair)
    assert read.by_cluster == {east: 1, west: 2}
    assert units.read_free_to_take(pair) == read  # the sets are chosen from this one read, not capped counts
    assert sorted(row[2] for row in read.gpus) == sorted(
        GpuCapacity.objects.filter(node__name__in=["east-train", "west-train"])
        .exclude(uuid__in=world.busy)
        .values_list("pk", flat=True)
    )


def test_a_named_cluster_counts_that_cluster_only(world, make_request, fleet):
    for fields in (MIG, FULL, TIMESLICE):
        request = fresh(make_request(cluster=fleet.cluster("west"), **fields))
        assert list(units.read_free(request).by_cluster) == [world.west], fields


def test_the_busy_devices_are_read_once_and_shares_need_one_query(world, make_request, django_assert_num_queries):
    mig = fresh(make_request(**MIG))
    with django_assert_num_queries(2):  # the multi-device pods, then the count
        assert units.read_free(mig).busy_devices == world.busy
    with django_assert_num_queries(1):  # the caller read them already
        assert units.read_free(mig, frozenset()).by_cluster == {world.east: 4, world.west: 1}
    shared = fresh(make_request(**TIMESLICE))
    with django_assert_num_queries(1):
        assert units.read_free(shared).by_cluster == {world.east: 3, world.west: 4}


def test_counts_over_the_fleet_read_each_holder_once_and_the_take_probes_per_unit(world, make_request):
    """fleet=True (read_free's counts): each holder an uncorrelated `pk IN (subquery)`, read once; the default
    (what approval locks and takes from) the correlated EXISTS probes (tests/pools/test_free_units_plan.py
    checks the plans on PostgreSQL)."""

    def probes(sql: str) -> int:
        return sql.upper().count("EXISTS")

    mig, full = fresh(make_request(**MIG)), fresh(make_request(**FULL))
    pair = fresh(make_request(isolation="full", profile_name="", count=2))
    for request, candidates in (
        (mig, units.mig_candidates),
        (full, units.full_candidates),
        (pair, units.full_candidates),
    ):
        counted = probes(str(candidates(request, frozenset(), fleet=True).query))
        taken = probes(str(candidates(request, frozenset()).query))
        assert counted + 3 == taken  # reserved, in use and ending: three holders read once instead
        with CaptureQueriesContext(connection) as queries:
            units.read_free(request, frozenset())
        (count,) = [q["sql"] for q in queries.captured_queries]
        assert probes(count) == counted, request.spec_kind


def test_clusters_at_the_cap_look_alike_and_the_lowest_id_is_chosen(fleet, make_request, operator, monkeypatch):
    fleet.cluster("spare")
    fleet.mig_node("a-mig", [THREE_THREE, THREE_THREE], cluster="a")
    fleet.full_node("a-train-1", gpus=1, cluster="a")
    fleet.full_node("a-train-2", gpus=1, cluster="a")
    fleet.full_node("a-train-3", gpus=2, cluster="a")
    fleet.mig_node("b-mig", [THREE_THREE, ["3g.40gb"]], cluster="b")
    fleet.full_node("b-train-1", gpus=3, cluster="b")
    a, b = fleet.cluster("a").pk, fleet.cluster("b").pk
    monkeypatch.setattr(picking, "COUNT_CAP", 2)
    mig = make_request(**MIG)
    for request in (mig, fresh(mig), fresh(make_request(**FULL))):
        assert units.read_free(request).by_cluster == {a: 4, b: 3}
        assert units.read_free_to_take(request).by_cluster == {a: 2, b: 2}
    assert services.approve(fresh(make_request(**FULL)), actor=operator).cluster_id == a
    assert services.approve(mig, actor=operator).cluster_id == a


def test_only_a_vgpu_request_names_a_vgpu_type():
    name = next(iter(VGPU_TYPES))
    assert units.request_vgpu(PoolRequest(spec_kind="vgpu", profile_name=name)) == VGPU_TYPES[name]
    for kind in ("full", "mig", "mps", "timeslice"):
        assert units.request_vgpu(PoolRequest(spec_kind=kind, profile_name=name)) is None, kind


def test_a_unit_is_a_value():
    unit = units.Unit(7, 11, 0, "nvidia.com/mig-3g.40gb", "H100-80GB", "3g.40gb", 3, "east-mig", 2)
    assert unit == dataclasses.replace(unit) and len({unit, dataclasses.replace(unit)}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        unit.cluster_id = 3


def _clusters(**bindings: str) -> dict[str, int]:
    Cluster.objects.create(name="spare", kubeconfig_path="/tmp/spare")
    return {
        name: Cluster.objects.create(name=name, kubeconfig_path=f"/tmp/{name}", binding=binding).pk
        for name, binding in bindings.items()
    }


PLUGIN, DRA = Binding.DEVICE_PLUGIN, Binding.DRA


def test_best_fit_and_the_clusters_a_request_may_span(db):
    c = _clusters(a=PLUGIN, b=PLUGIN, d=DRA)
    assert units.choose_clusters({c["a"]: 3, c["b"]: 2, c["d"]: 1}, 2) == [c["b"], c["a"]]
    assert units.choose_clusters({c["a"]: 2, c["b"]: 2, c["d"]: 5}, 2) == [c["a"], c["b"], c["d"]]
    assert units.choose_clusters({c["a"]: 1}, 2) == []
    spanning = PoolRequest(spec_kind="mig", count=3, allow_multi_cluster=True)
    assert units.may_span(spanning)
    assert not units.may_span(PoolRequest(spec_kind="mig", count=3))
    assert not units.may_span(PoolRequest(spec_kind="mig", count=3, allow_multi_cluster=True, cluster_id=c["a"]))
    assert not units.may_span(PoolRequest(spec_kind="full", count=2, allow_multi_cluster=True))  # one node
    assert units.may_span(PoolRequest(spec_kind="full", count=1, allow_multi_cluster=True))
    free = {c["a"]: 3, c["b"]: 2, c["d"]: 4}
    assert units.usable_free(spanning, free) == 5  # a + b: one binding; d alone has 4
    assert units.usable_free(PoolRequest(spec_kind="mig", count=3), free) == 4
    assert units.usable_free(spanning, {}) == units.usable_free(PoolRequest(spec_kind="mig"), {}) == 0


def test_spreading_takes_the_largest_first_within_the_binding_needing_the_fewest_clusters(db):
    c = _clusters(a=PLUGIN, b=PLUGIN, e=PLUGIN, d=DRA, f=DRA)
    a, b, e, d, f = (c[n] for n in "abedf")
    assert units.spread_clusters({a: 1, b: 4}, 5) == [b, a]  # the larger first, whatever the ids
    assert units.spread_clusters({a: 4, b: 2}, 5) == [a, b]  # 6 covers 5
    assert units.spread_clusters({a: 2, b: 2}, 5) == []
    assert units.spread_clusters({a: 3, b: 2, d: 4}, 5) == [a, b]  # d alone is one short
    assert units.spread_clusters({a: 4, b: 1, e: 1, d: 3, f: 3}, 6) == [d, f]  # 2 clusters, not 3
    assert units.spread_clusters({d: 4, f: 1, a: 2, b: 2, e: 2}, 5) == [d, f]  # 2 clusters, not 3
    assert units.spread_clusters({a: 3, b: 2, d: 3, f: 2}, 5) == [a, b]  # a tie: the first binding found
    assert units.spread_clusters({a: 3, b: 0, d: 2}, 3) == [a, b]  # an emptied cluster comes last


def test_the_product_narrows_whole_gpus_and_replicas(fleet, make_request):
    fleet.cluster("spare")
    fleet.full_node("east-h100", gpus=2, cluster="east")
    fleet.full_node("west-a100", gpus=3, cluster="west", product="A100-80GB")
    fleet.timeslice_node("east-shared", gpus=1, replicas=4, cluster="east")
    fleet.timeslice_node("west-shared", gpus=1, replicas=2, cluster="west", product="A100-80GB")
    east, west = fleet.cluster("east").pk, fleet.cluster("west").pk
    for product, full, shared in (("H100-80GB", {east: 2}, {east: 4}), ("A100-80GB", {west: 3}, {west: 2})):
        request = fresh(make_request(product=product, **FULL))
        assert units.read_free(request).by_cluster == full, product
        request = fresh(make_request(product=product, **TIMESLICE))
        assert units.read_free(request).by_cluster == shared, product
