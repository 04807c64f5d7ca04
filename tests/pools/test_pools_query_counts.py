"""What one approval and one queue pass cost in queries, pinned so a regression cannot come back silently.

`bench queue --gpus 512` (docs/benchmarks.md) is bound by these round trips: approval reads the free units
once (pools/units/free.py read_free) and chooses cluster, node and NVLink set from that read, then locks.
The bounds hold however large the fleet: 4 nodes here, 64 in the bench, the same count.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pools import services
from pools.choices import RequestState
from pools.models import AutoApprovalPolicy
from scheduling import queue

pytestmark = pytest.mark.django_db

FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": ""}
# Claim, audit row, busy devices, free GPUs, lock, held re-read, pool, allocations, pool clusters, cluster
# names, the move to provisioning and its audit row, the provisioning lease, the savepoints, and the
# notifications app's event row (one INSERT ... ON CONFLICT DO NOTHING; its fan-out runs after commit)
# (before #17's profiling: 20 for one GPU, 23 for four, the free GPUs read five times).
APPROVAL_QUERIES = 20


def sql(captured) -> list[str]:
    return [q["sql"] for q in captured.captured_queries]


@pytest.fixture
def four_nodes(fleet):
    for name in ("n1", "n2", "n3", "n4"):
        fleet.full_node(name, gpus=8)


@pytest.mark.parametrize("count", [1, 4])
def test_one_approval_costs_a_bounded_number_of_queries(four_nodes, make_request, operator, count):
    request = make_request(count=count, **FULL)
    with CaptureQueriesContext(connection) as captured:
        pool = services.approve(request, actor=operator)
    assert pool.allocations.count() == count
    assert len(captured) <= APPROVAL_QUERIES, "\n".join(sql(captured))


def test_one_approval_reads_the_free_units_once(four_nodes, make_request, operator):
    request = make_request(count=4, **FULL)
    with CaptureQueriesContext(connection) as captured:
        services.approve(request, actor=operator)
    reads = [q for q in sql(captured) if 'FROM "capacity_gpucapacity"' in q]
    assert len(reads) == 2, "\n".join(reads)  # the free GPUs with their node and groups, then the lock
    # The lock is a FOR UPDATE where the database has row locks (PostgreSQL); SQLite locks the whole
    # database on write and Django sends it no FOR UPDATE.
    locks = sum("FOR UPDATE" in q for q in reads)
    assert locks == (1 if connection.features.has_select_for_update else 0), "\n".join(reads)


def test_one_queue_pass_that_approves_the_head_costs_a_bounded_number_of_queries(four_nodes, make_request, operator):
    AutoApprovalPolicy.objects.create(name="every request")
    holders = [make_request(count=8, **FULL) for _ in range(4)]
    for holder in holders:
        services.approve(holder, actor=operator)
    waiting = [make_request(count=n, wait_if_full=True, **FULL) for n in (4, 8, 2)]
    for request in waiting:
        queue.after_submit(request)
        request.refresh_from_db()
        assert request.state == RequestState.QUEUED
    services.release(holders[0], actor=operator)
    with CaptureQueriesContext(connection) as captured:
        result = queue.process()
    # The 4 is approved; the 8 behind it no longer fits and blocks its spec, so the 2 waits too.
    assert (result.approved, result.blocked) == ([waiting[0].pk], [waiting[1].pk])
    # Lock, policies (2), order (3), the head's fit test (busy devices, free GPUs), its approval without
    # reading them again, its audit row, the next fit test (free GPUs only), the savepoints (38 before), and
    # the read of loans the head ran on, which leaving the queue ends (pools.lending.end_request_loans).
    assert len(captured) <= APPROVAL_QUERIES + 13, "\n".join(sql(captured))
