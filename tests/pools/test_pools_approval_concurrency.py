"""Concurrent approvals on PostgreSQL: SKIP LOCKED row locks mean no unit is ever taken twice."""

from collections import Counter

import pytest
from pool_world import run_concurrently

from pools import services
from pools.exceptions import IllegalTransition, InsufficientCapacity
from pools.models import Allocation, PoolRequest

# Threads need committed rows; the MIG catalog comes back after each flush (post_migrate).
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_competing_approvals_never_share_a_unit(fleet, make_request, operator):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]] * 3)  # 6 units
    requests = [make_request(count=1) for _ in range(12)]
    outcomes = run_concurrently([lambda r=r: services.approve(r, actor=operator) for r in requests])
    kinds = Counter(type(o).__name__ for o in outcomes)
    assert kinds == {"GpuPool": 6, "InsufficientCapacity": 6}
    active = Allocation.objects.active()
    assert active.count() == 6
    assert active.values("mig_instance").distinct().count() == 6
    refused = [r.pk for r, o in zip(requests, outcomes, strict=True) if isinstance(o, InsufficientCapacity)]
    assert set(PoolRequest.objects.filter(pk__in=refused).values_list("state", flat=True)) == {"submitted"}


def test_multi_unit_approvals_are_all_or_nothing(fleet, make_request, operator):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]] * 3)  # 6 units, 4 requests of 2
    requests = [make_request(count=2) for _ in range(4)]
    outcomes = run_concurrently([lambda r=r: services.approve(r, actor=operator) for r in requests])
    assert Counter(type(o).__name__ for o in outcomes) == {"GpuPool": 3, "InsufficientCapacity": 1}
    per_pool = Counter(Allocation.objects.active().values_list("pool_id", flat=True))
    assert sorted(per_pool.values()) == [2, 2, 2]


def test_one_request_approved_twice_at_once_is_approved_once(fleet, make_request, operator):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]] * 2)
    request = make_request(count=1)
    copies = [PoolRequest.objects.get(pk=request.pk) for _ in range(4)]
    outcomes = run_concurrently([lambda r=r: services.approve(r, actor=operator) for r in copies])
    assert Counter(type(o).__name__ for o in outcomes) == {"GpuPool": 1, "IllegalTransition": 3}
    assert all(o.from_state in ("approved", "provisioning") for o in outcomes if isinstance(o, IllegalTransition))
    assert Allocation.objects.count() == 1
