"""Approval's records and retries (pools/services/approval.py, #32): the pool, its transitions and its units as
approval writes them, on two clusters where another project already holds a unit; collisions start over.

World: a spare cluster registered first (so cluster, node, GPU and instance ids all differ), east with 4 free
3g.40gb instances, west with 2 of which another project's dedicated pool holds one. Requests are read back
from the database before approval, as the queue and the API hand them over.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.db import IntegrityError

from pools import services, units
from pools.exceptions import DomainError, InsufficientCapacity
from pools.models import Allocation, GpuPool, PoolRequest
from pools.services import approval

pytestmark = pytest.mark.django_db
THREE_THREE = ["3g.40gb", "3g.40gb"]


@pytest.fixture
def world(fleet, make_request, operator, other_project, charlie):
    fleet.cluster("spare")
    fleet.mig_node("east-1", [THREE_THREE, THREE_THREE], cluster="east")
    fleet.mig_node("west-1", [THREE_THREE], cluster="west")
    theirs = services.approve(
        make_request(count=1, target=other_project, actor=charlie), actor=operator, cluster=fleet.cluster("west")
    )
    ids = {
        "east": fleet.cluster("east").pk,
        "west": fleet.cluster("west").pk,
        "theirs": set(theirs.allocations.values_list("mig_instance_id", flat=True)),
    }
    assert ids["east"] != fleet.clusters["east"].nodes.get().pk
    return SimpleNamespace(fleet=fleet, theirs=theirs, ids=ids)


def fresh(request: PoolRequest) -> PoolRequest:
    return PoolRequest.objects.get(pk=request.pk)


def on_clusters(pool) -> dict[str, int]:
    found: dict[str, int] = {}
    for name in pool.allocations.values_list("gpu__node__cluster__name", flat=True):
        found[name] = found.get(name, 0) + 1
    return found


def reasons(request) -> list[tuple[str, str]]:
    return list(request.transitions.order_by("pk").values_list("to_state", "reason"))[1:]


def never_theirs(world, pool) -> None:
    mine = set(pool.allocations.values_list("mig_instance_id", flat=True))
    assert mine and not mine & world.ids["theirs"]
    assert Allocation.objects.filter(pool=world.theirs).count() == 1


def test_a_collision_starts_over_and_the_third_attempt_is_the_last(world, make_request, operator, monkeypatch, caplog):
    real = approval._approve_once
    calls = []

    def collides_twice(request, **kwargs):
        calls.append(kwargs["free"])
        pool = real(request, **kwargs)  # writes its rows, then the unique constraint trips: all rolled back
        if len(calls) <= 2:
            raise IntegrityError("UNIQUE constraint failed: pools_allocation.mig_instance_id")
        return pool

    monkeypatch.setattr(approval, "_approve_once", collides_twice)
    request = fresh(make_request(count=3))
    with caplog.at_level(logging.INFO, logger=approval.__name__):
        pool = services.approve(request, actor=operator)
    assert len(calls) == 3 == approval.APPROVAL_ATTEMPTS
    assert [r.getMessage() for r in caplog.records] == [
        f"approval of request {request.pk} collided on a unit (attempt 1 of 3)",
        f"approval of request {request.pk} collided on a unit (attempt 2 of 3)",
    ]
    assert GpuPool.objects.filter(request=request).get() == pool
    assert on_clusters(pool) == {"east": 3}
    assert fresh(request).state == "provisioning"
    never_theirs(world, pool)


def test_collisions_on_every_attempt_give_up_after_three_and_leave_the_request_submitted(
    world, make_request, operator, monkeypatch
):
    real = approval._approve_once
    calls = []

    def always_collides(request, **kwargs):
        calls.append(1)
        real(request, **kwargs)
        raise IntegrityError("UNIQUE constraint failed: pools_allocation.mig_instance_id")

    monkeypatch.setattr(approval, "_approve_once", always_collides)
    request = fresh(make_request(count=2))
    with pytest.raises(DomainError, match=r"^Units were taken by concurrent approvals; try again\.$"):
        services.approve(request, actor=operator)
    assert len(calls) == 3
    assert (request.state, request.approved_at, request.approved_by) == ("submitted", None, None)
    assert not GpuPool.objects.filter(request=request).exists()
    assert Allocation.objects.count() == 1  # the other project's unit only


def test_a_refusal_restores_the_request_object_it_was_given(world, make_request, operator):
    request = fresh(make_request(count=5))  # 4 free on east, 1 on west: no one cluster has 5
    with pytest.raises(InsufficientCapacity):
        services.approve(request, actor=operator)
    # The object itself, not only the row: the caller goes on with it.
    assert (request.state, request.approved_at, request.approved_by_id) == ("submitted", None, None)
    assert fresh(request).state == "submitted"


def test_a_request_ending_later_is_approved_and_one_ending_now_is_not(world, make_request, operator, monkeypatch):
    now = datetime(2026, 12, 7, 11, 0, tzinfo=UTC)
    monkeypatch.setattr(approval, "timezone", SimpleNamespace(now=lambda: now))
    ending_now = make_request(count=1)
    PoolRequest.objects.filter(pk=ending_now.pk).update(start_at=now - timedelta(days=1), end_at=now)
    with pytest.raises(DomainError, match="ended at 2026-12-07 11:00"):
        services.approve(fresh(ending_now), actor=operator)
    later = make_request(count=1)
    PoolRequest.objects.filter(pk=later.pk).update(start_at=now, end_at=now + timedelta(microseconds=1))
    pool = services.approve(fresh(later), actor=operator)
    assert pool.allocations.get().allocated_at == now
    assert fresh(ending_now).state == "submitted"


def test_the_operators_cluster_and_the_requests_own_cluster_override_best_fit(world, make_request, operator):
    # Best fit for one unit is west (1 free); the operator names east.
    chosen = services.approve(fresh(make_request(count=1)), actor=operator, cluster=world.fleet.cluster("east"))
    assert on_clusters(chosen) == {"east": 1}
    own = make_request(count=1, cluster=world.fleet.cluster("east"))
    assert services.approve(fresh(own), actor=operator).cluster.name == "east"
    best_fit = services.approve(fresh(make_request(count=1)), actor=operator)
    assert on_clusters(best_fit) == {"west": 1}
    for pool in (chosen, best_fit):
        never_theirs(world, pool)


def test_the_pool_keeps_the_request_name_tags_and_reason(world, make_request, operator):
    label = "H100-80GB 3g.40gb"
    named = make_request(count=1, name="train-7", tags=["llm", label, "A-team"])
    pool = services.approve(fresh(named), actor=operator, reason="fits the quota")
    assert (pool.name, pool.tags) == ("train-7", [label, "llm", "A-team"])
    assert reasons(named) == [("approved", "fits the quota"), ("provisioning", "1 units on west; provisioning")]
    unnamed = make_request(count=2, tags=[])
    pool = services.approve(fresh(unnamed), actor=operator)
    assert (pool.name, pool.tags, pool.cluster.name) == (f"pool-{unnamed.pk}", [label], "east")
    assert reasons(unnamed) == [("approved", "approved"), ("provisioning", "2 units on east; provisioning")]


def test_a_spanning_pool_is_homed_on_its_largest_cluster_and_says_where_its_units_are(
    world, make_request, operator, monkeypatch
):
    locked = []
    real_lock = units.lock_clusters
    monkeypatch.setattr(units, "lock_clusters", lambda ids: (locked.append(sorted(ids)), real_lock(ids)))
    services.approve(fresh(make_request(count=1)), actor=operator, cluster=world.fleet.cluster("east"))
    assert locked == []  # a request that cannot span locks no cluster
    request = make_request(count=4, allow_multi_cluster=True)  # 3 free on east, 1 on west
    pool = services.approve(fresh(request), actor=operator)
    assert locked == [sorted([world.ids["east"], world.ids["west"]])]  # spanning approvals take turns
    assert on_clusters(pool) == {"east": 3, "west": 1}
    assert pool.cluster.name == "east"
    assert list(pool.pool_clusters.order_by("pk").values_list("cluster__name", "units")) == [("east", 3), ("west", 1)]
    assert reasons(request)[-1] == ("provisioning", "4 units on east (3), west (1); provisioning")
    never_theirs(world, pool)


def test_a_stale_read_of_free_units_takes_only_what_is_still_free(
    world, make_request, operator, other_project, charlie
):
    request = fresh(make_request(count=2))
    stale = units.read_free(request)
    assert stale.by_cluster == {world.ids["east"]: 4, world.ids["west"]: 1}
    services.approve(make_request(count=3, target=other_project, actor=charlie), actor=operator)  # 3 of east
    with pytest.raises(InsufficientCapacity, match=r"^need 2 x H100-80GB 3g.40gb on one cluster, at most 1 free"):
        services.approve(request, actor=operator, free=stale)
    assert not GpuPool.objects.filter(request=request).exists()


def test_hundreds_of_time_slice_replicas_on_one_cluster_then_across_two(fleet, make_request, operator):
    """Counts past 256 (an identity test of ints would fail there): 300 replicas on one cluster, then 450 across
    both, east's last 100 after west's 400."""
    fleet.cluster("spare")
    fleet.timeslice_node("east-shared", gpus=8, replicas=50, cluster="east")
    fleet.timeslice_node("west-shared", gpus=8, replicas=50, cluster="west")
    one = make_request(isolation="timeslice", profile_name="", count=300)
    pool = services.approve(fresh(one), actor=operator)
    assert on_clusters(pool) == {"east": 300}
    assert reasons(one)[-1] == ("provisioning", "300 units on east; provisioning")
    wide = make_request(isolation="timeslice", profile_name="", count=450, allow_multi_cluster=True)
    pool = services.approve(fresh(wide), actor=operator)
    assert on_clusters(pool) == {"west": 400, "east": 50}
    assert reasons(wide)[-1] == ("provisioning", "450 units on west (400), east (50); provisioning")
    assert Allocation.objects.values("gpu", "replica").distinct().count() == 750


def test_a_pool_across_three_clusters_takes_what_each_has_left(fleet, make_request, operator):
    fleet.cluster("spare")
    for name in ("north", "south", "east"):
        fleet.mig_node(f"{name}-1", [THREE_THREE], cluster=name)
    request = make_request(count=6, allow_multi_cluster=True)
    pool = services.approve(fresh(request), actor=operator)
    assert on_clusters(pool) == {"north": 2, "south": 2, "east": 2}
    assert reasons(request)[-1] == ("provisioning", "6 units on north (2), south (2), east (2); provisioning")
