"""How approval takes units (pools/units/take.py) and counts clusters (capacity/picking.py), in worlds unlike toy
ones: two clusters after a spare one (cluster, node and GPU ids differ), whole, MIG and time-sliced GPUs side by
side, and another project's units present.

- a unit another approval committed after the candidates were read is skipped and the next one taken (MIG and
  whole GPUs), exactly as many as needed;
- candidates are locked FOR UPDATE SKIP LOCKED OF self where the database can, not at all where it cannot;
- whole GPUs record their catalog product (cut to the column) and compute slices (7 when the catalog does not
  know the GPU), replica 0; time-slice replicas not held are taken in order, weighted by slices per replica;
- a move off a node takes the project's own other node first, even one another project shares;
- clusters are counted up to 128 free units each: best fit under it, the lowest id at it.
"""

from __future__ import annotations

import pytest
from django.db import connection

from capacity.choices import GpuHealth, SpecKind, Tier
from capacity.models import GpuCapacity, MigInstance, NodeCapacity, SpecAndCount
from pools import services, units
from pools.models import Allocation, PoolRequest
from pools.units import take

pytestmark = pytest.mark.django_db
THREE_THREE = ["3g.40gb", "3g.40gb"]
FULL = dict(isolation="full", product="H100-80GB", profile_name="")
LONG_NAME = "Acme Tensor Accelerator X9 Extended Memory Edition"  # 50 characters, unknown to the catalog


@pytest.fixture
def world(fleet, other_project, make_request, operator):
    """A cordoned spare cluster first (ids shift), then clusters a and b; team-b holds units on both."""
    spare = fleet.full_node("spare-1", gpus=3, cluster="spare")
    NodeCapacity.objects.filter(pk=spare.pk).update(cordoned=True)
    fleet.mig_node("a-mig", [THREE_THREE, THREE_THREE], cluster="a")
    fleet.full_node("a-full", gpus=3, cluster="a")
    fleet.mig_node("b-mig", [THREE_THREE], cluster="b")
    services.approve(make_request(count=1, target=other_project, actor=operator), actor=operator)  # on b (best fit)
    services.approve(make_request(count=1, target=other_project, actor=operator, **FULL), actor=operator)  # a-full 0
    return fleet


def _mig(project, count: int = 1) -> PoolRequest:
    return PoolRequest(
        project=project,
        count=count,
        spec_kind=SpecKind.MIG,
        isolation="mig",
        product="H100-80GB",
        profile_name="3g.40gb",
        tier=Tier.SLA_INFERENCE,
    )


def _full(project, product: str = "H100-80GB", count: int = 1) -> PoolRequest:
    return PoolRequest(
        project=project, count=count, spec_kind=SpecKind.FULL, isolation="full", product=product, tier=Tier.TRAINING
    )


def test_a_mig_unit_held_after_the_read_is_skipped_and_the_next_taken(
    world, project, make_request, operator, monkeypatch
):
    a = world.clusters["a"]
    NodeCapacity.objects.filter(name="b-mig").update(cordoned=True)
    mine = services.approve(make_request(count=1), actor=operator).allocations.get()  # committed meanwhile
    # What a read that predates that approval saw: every instance of the profile, the one now held included.
    monkeypatch.setattr(
        take, "mig_candidates", lambda request, busy=None: MigInstance.objects.filter(profile__name="3g.40gb")
    )
    instance = {(i.gpu.index, i.placement_start): i.pk for i in MigInstance.objects.filter(gpu__node__name="a-mig")}
    assert mine.mig_instance_id == instance[0, 0]  # own units do not make a node or GPU shared: it ranks first
    taken = units.take_units(_mig(project, 2), a.pk, 2)
    assert [u.mig_instance_id for u in taken] == [instance[0, 4], instance[1, 0]]
    assert {(u.cluster_id, u.replica, u.compute_slices, u.node_name) for u in taken} == {(a.pk, 0, 3, "a-mig")}


def test_a_whole_gpu_held_after_the_read_is_skipped_and_the_next_taken(
    world, project, make_request, operator, monkeypatch
):
    a = world.clusters["a"]
    mine = services.approve(make_request(count=1, **FULL), actor=operator).allocations.get()
    assert mine.gpu.index == 1  # team-b holds GPU 0
    monkeypatch.setattr(take, "full_candidates", lambda request, busy=None: GpuCapacity.objects.whole_gpu_hosts())
    (unit,) = units.take_units(_full(project), a.pk, 1)  # GPU 1 ranks first (only mine on it), then GPU 2
    gpu = GpuCapacity.objects.get(node__name="a-full", index=2)
    assert (unit.gpu_id, unit.node_name, unit.cluster_id, unit.replica) == (gpu.pk, "a-full", a.pk, 0)


def test_candidates_are_locked_skipping_locked_rows_where_the_database_can(monkeypatch):
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", True)
    query = take._lock(GpuCapacity.objects.all()).query
    assert (query.select_for_update, query.select_for_update_skip_locked, query.select_for_update_of) == (
        True,
        True,
        ("self",),
    )
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    assert not take._lock(GpuCapacity.objects.all()).query.select_for_update


def _whole_gpu_node(fleet, name: str, cluster: str, gpus: list[tuple[str, str]]) -> NodeCapacity:
    """A training node whose GPUs are (catalog product, product) as discovery recorded them."""
    node = fleet.node(name, cluster=cluster, tier=Tier.TRAINING, product="A30-24GB")
    for index, (catalog_product, product) in enumerate(gpus):
        GpuCapacity.objects.create(
            node=node, index=index, uuid=f"GPU-{name}-{index}", product=product, catalog_product=catalog_product
        )
    SpecAndCount.objects.create(
        node=node,
        kind="full",
        product="A30-24GB",
        resource_name="nvidia.com/gpu",
        count=len(gpus),
        allocatable=len(gpus),
    )
    return node


def test_whole_gpus_record_their_catalog_product_and_compute_slices(world, project):
    b = world.clusters["b"]
    _whole_gpu_node(world, "b-odd", "b", [("A30-24GB", "NVIDIA A30 board rev 2"), ("", LONG_NAME)])
    (a30,) = units.take_units(_full(project, "A30-24GB"), b.pk, 1)
    assert (a30.product, a30.compute_slices, a30.replica, a30.mig_instance_id, a30.resource_name) == (
        "A30-24GB",
        4,
        0,
        None,
        "nvidia.com/gpu",
    )
    (odd,) = units.take_units(_full(project, LONG_NAME), b.pk, 1)
    assert (odd.product, odd.compute_slices, odd.replica, odd.node_name) == (LONG_NAME[:32], 7, 0, "b-odd")
    assert odd.gpu_id == GpuCapacity.objects.get(product=LONG_NAME).pk != a30.gpu_id


def _timeslice(project, count: int) -> PoolRequest:
    return PoolRequest(
        project=project,
        count=count,
        spec_kind=SpecKind.TIMESLICE,
        isolation="timeslice",
        product="H100-80GB",
        tier=Tier.DEVELOPMENT,
    )


def test_time_slice_replicas_not_held_are_taken_in_order_and_weighted(
    world, project, other_project, make_request, operator
):
    a, b = world.clusters["a"], world.clusters["b"]
    world.timeslice_node("a-ts", gpus=4, replicas=4, cluster="a")
    world.timeslice_node("b-ts", gpus=1, replicas=16, cluster="b")
    spec = dict(isolation="timeslice", product="H100-80GB", profile_name="")
    services.approve(make_request(count=2, **spec), actor=operator)  # mine: replicas 0 and 1 of a-ts GPU 0
    services.approve(make_request(count=1, target=other_project, actor=operator, **spec), actor=operator)
    held = {(a.gpu.node.name, a.gpu.index, a.replica) for a in Allocation.objects.filter(kind="timeslice")}
    assert ("a-ts", 0, 0) in held and ("a-ts", 0, 1) in held and len(held) == 3
    assert ("a-ts", 1, 0) in held  # team-b's: GPU 1 is shared now
    taken = units.take_units(_timeslice(project, 3), a.pk, 3)
    # The GPU only my project holds first, its free replicas in order, then GPUs nobody else holds.
    assert [(GpuCapacity.objects.get(pk=u.gpu_id).index, u.replica) for u in taken] == [(0, 2), (0, 3), (2, 0)]
    assert {(u.compute_slices, u.resource_name, u.profile_name, u.product) for u in taken} == {
        (2, "nvidia.com/gpu", "", "H100-80GB")  # 7 slices over 4 replicas
    }
    (one,) = units.take_units(_timeslice(project, 1), b.pk, 1)
    assert (one.compute_slices, one.replica, one.node_name) == (1, 0, "b-ts")  # 7 / 16 rounds to 0: at least 1


def test_a_move_takes_the_projects_own_other_node_first_even_a_shared_one(
    fleet, project, other_project, make_request, operator
):
    fleet.full_node("spare-1", gpus=1, cluster="spare")
    for name, gpus in (("c-from", 2), ("c-own", 3), ("c-free", 2)):
        fleet.full_node(name, gpus=gpus, cluster="c")
    c = fleet.clusters["c"]
    for owner, node in ((project, "c-from"), (project, "c-own"), (other_project, "c-own")):
        NodeCapacity.objects.exclude(name=node).update(cordoned=True)
        services.approve(make_request(count=1, target=owner, actor=operator, **FULL), actor=operator)
        NodeCapacity.objects.update(cordoned=False)
    away = frozenset(NodeCapacity.objects.filter(name="c-from").values_list("pk", flat=True))
    (unit,) = units.take_units(_full(project), c.pk, 1, away_from=away)
    assert unit.node_name == "c-own"  # not c-free, which nobody else uses, nor the node it moves off
    (unit,) = units.take_units(_full(project), c.pk, 1)
    assert unit.node_name == "c-from"  # not moving: nodes no other project uses first (c-from, c-free), by id


def test_clusters_are_counted_up_to_128_free_units(fleet, make_request, operator):
    """a: 129 free, b: 128 (ids: a < b). Both count as 128: the lowest id wins. Then a: 128 (at the cap), b: 127
    (under it, exact): the best fit, b."""
    spare = fleet.full_node("spare-1", gpus=1, cluster="spare")
    NodeCapacity.objects.filter(pk=spare.pk).update(cordoned=True)
    for cluster, total in (("a", 129), ("b", 128)):
        for n, start in enumerate(range(0, total, 8)):
            fleet.full_node(f"{cluster}-{n}", gpus=min(8, total - start), cluster=cluster)
    first = services.approve(make_request(count=1, **FULL), actor=operator)
    assert first.cluster.name == "a"
    sick = GpuCapacity.objects.filter(node__cluster__name="b").order_by("pk").first()
    GpuCapacity.objects.filter(pk=sick.pk).update(health=GpuHealth.UNHEALTHY)
    request = make_request(count=1, **FULL)
    assert units.read_free_to_take(request).by_cluster == {fleet.clusters["a"].pk: 128, fleet.clusters["b"].pk: 127}
    assert services.approve(request, actor=operator).cluster.name == "b"
