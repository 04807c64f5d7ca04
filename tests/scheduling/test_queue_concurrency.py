"""Concurrent releases and queue passes on PostgreSQL: each freed unit goes to the queue once, in order."""

from collections import Counter

import pytest
from pool_world import run_concurrently

from pools import services
from pools.choices import QueueAction, RequestState
from pools.models import Allocation, AutoApprovalPolicy, PoolRequest, QueueEvent
from scheduling import queue

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": "", "wait_if_full": True}


@pytest.fixture
def full_queue(fleet, make_request, operator):
    """Two GPUs held by two requests; three one-GPU requests waiting; a policy that allows them all."""
    fleet.full_node("t1", gpus=2)
    holders = [make_request(count=1, **FULL) for _ in range(2)]
    for holder in holders:
        services.approve(holder, actor=operator)
    waiting = [make_request(count=1, **FULL) for _ in range(3)]
    for request in waiting:
        queue.enqueue(request)
    AutoApprovalPolicy.objects.create(name="any")
    return holders, waiting


def release_then_process(request, operator):
    services.release(PoolRequest.objects.get(pk=request.pk), actor=operator)
    return queue.process()


def test_concurrent_releases_approve_each_queued_request_once_in_order(full_queue, operator):
    holders, waiting = full_queue
    outcomes = run_concurrently([lambda h=h: release_then_process(h, operator) for h in holders])
    assert not [o for o in outcomes if isinstance(o, Exception)]
    approved = [pk for o in outcomes for pk in o.approved]
    assert sorted(approved) == [waiting[0].pk, waiting[1].pk]  # the two heads, each once
    states = dict(PoolRequest.objects.filter(pk__in=[r.pk for r in waiting]).values_list("pk", "state"))
    assert states[waiting[2].pk] == RequestState.QUEUED
    events = Counter(QueueEvent.objects.filter(action=QueueAction.AUTO_APPROVED).values_list("request_id", flat=True))
    assert events == {waiting[0].pk: 1, waiting[1].pk: 1}
    active = Allocation.objects.active()
    assert active.count() == 2 and active.values("gpu").distinct().count() == 2


def test_many_passes_at_once_approve_the_head_exactly_once(full_queue, operator):
    holders, waiting = full_queue
    services.release(holders[0], actor=operator)
    outcomes = run_concurrently([queue.process for _ in range(6)])
    assert not [o for o in outcomes if isinstance(o, Exception)]
    assert [pk for o in outcomes for pk in o.approved] == [waiting[0].pk]
    assert QueueEvent.objects.filter(action=QueueAction.AUTO_APPROVED).count() == 1
    assert PoolRequest.objects.get(pk=waiting[1].pk).state == RequestState.QUEUED
