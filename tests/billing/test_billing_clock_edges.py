"""Edges of the billing clock (billing/services/clock.py): which states are "failed now", where a failed period
opens when the history does not say, and a unit withheld by its GPU's and its own MIG instance's events at once.

The world: two clusters ("billing" from the allocate fixture and "east"), GPU ids unlike allocation ids, units
of two projects, metered 10:00-13:00 on 2026-03-10 at the default card (H100-80GB 2.50/h for a full GPU).
"""

from decimal import Decimal

import pytest
from billing_helpers import at, month, transition

from billing import services
from billing.models import UsageRecord
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from monitoring.models import HealthEvent
from pools.models import GpuPool

pytestmark = pytest.mark.django_db


def east_gpus(count: int) -> list[GpuCapacity]:
    east = Cluster.objects.create(name="east", kubeconfig_path="/dev/null")
    node = NodeCapacity.objects.create(cluster=east, name="east-1", gpu_count=8)
    return [
        GpuCapacity.objects.create(
            node=node, index=i, uuid=f"GPU-east-{i}", product="NVIDIA H100 80GB HBM3", catalog_product="H100-80GB"
        )
        for i in range(count)
    ]


def figures(allocation) -> list[tuple[str, int, int, int]]:
    """(hour, seconds, failed credit, health credit) of each metered hour of `allocation`."""
    return [
        (f"{hour:%H:%M}", seconds, failed, health)
        for hour, seconds, failed, health in UsageRecord.objects.filter(allocation=allocation)
        .order_by("hour")
        .values_list("hour", "seconds", "failed_credit_seconds", "health_credit_seconds")
    ]


def critical(gpu, opened: str, resolved: str, *, mig_instance=None, rule="xid_critical") -> HealthEvent:
    return HealthEvent.objects.create(
        gpu=gpu,
        mig_instance=mig_instance,
        rule=rule,
        level="critical",
        opened_at=at(opened),
        last_seen_at=at(opened),
        resolved_at=at(resolved),
    )


def test_released_pools_and_requests_are_not_failed_whatever_their_history_lacks(project, other_project, allocate):
    """A request created straight into "active" (as imports and the benchmark worlds make them) has no transition
    into "active" on record; released, it and its pool are in states that are not "failed", so its time is charged
    in full. Only a request or pool failed now (or a recorded failure) opens a credit."""
    east = east_gpus(3)
    released = allocate(project, "2026-03-10 10:00", "2026-03-10 12:30", gpu=east[2], pool_state="released")
    transition(released.pool.request, "active", "released", "2026-03-10 12:30")
    running = allocate(other_project, "2026-03-10 10:00")
    assert {released.gpu_id, running.gpu_id}.isdisjoint({released.pk, running.pk})

    services.meter_usage(now=at("2026-03-10 13:05"))
    statement = services.generate_statement(project, month("2026-03"))

    assert figures(released) == [("10:00", 3600, 0, 0), ("11:00", 3600, 0, 0), ("12:00", 1800, 0, 0)]
    assert figures(running) == [("10:00", 3600, 0, 0), ("11:00", 3600, 0, 0), ("12:00", 3600, 0, 0)]
    assert (statement.reserved_amount, statement.credit_amount, statement.total_amount) == (
        Decimal("6.25"),
        Decimal("0.00"),
        Decimal("6.25"),
    )


def test_a_pool_failed_now_without_a_recorded_failure_is_credited_from_the_requests_last_transition(
    project, other_project, allocate
):
    """The history says the request became active at 10:20 and never failed (a repair note at 10:40 is its last
    transition), but its pool is failed now: the credit runs from that last transition. Another project's
    request, active since 11:15 and not failed, gets none although its last transition lies inside its clock."""
    east = east_gpus(2)
    failed = allocate(project, "2026-03-10 10:00", gpu=east[1])
    transition(failed.pool.request, "approved", "provisioning", "2026-03-10 10:00")
    transition(failed.pool.request, "provisioning", "active", "2026-03-10 10:20")
    transition(failed.pool.request, "active", "active", "2026-03-10 10:40")  # a reconcile's repair note
    GpuPool.objects.filter(pk=failed.pool_id).update(state="failed")
    healthy = allocate(other_project, "2026-03-10 11:00")
    transition(healthy.pool.request, "approved", "provisioning", "2026-03-10 11:00")
    transition(healthy.pool.request, "provisioning", "active", "2026-03-10 11:15")

    services.meter_usage(now=at("2026-03-10 13:05"))

    assert figures(failed) == [("10:00", 3600, 1200, 0), ("11:00", 3600, 3600, 0), ("12:00", 3600, 3600, 0)]
    assert figures(healthy) == [("11:00", 3600, 0, 0), ("12:00", 3600, 0, 0)]
    statement = services.generate_statement(project, month("2026-03"))
    assert (statement.reserved_amount, statement.credit_amount, statement.total_amount) == (
        Decimal("7.50"),
        Decimal("-5.83"),
        Decimal("1.67"),
    )


def test_a_failure_whose_start_was_never_recorded_is_not_credited_and_a_later_one_is(project, other_project, allocate):
    """A request created straight into "failed" leaves it at 10:15 with no transition into it on record: when
    that failure began is unknown, so none of it is credited. Its second failure (10:40-11:00) is. Another
    project's request (an older one), failed and never active, is credited its whole life."""
    east = east_gpus(1)
    never = allocate(other_project, "2026-03-10 10:00", "2026-03-10 11:00", gpu=east[0], request_state="failed")
    unit = allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    request = unit.pool.request
    transition(request, "failed", "provisioning", "2026-03-10 10:15")
    transition(request, "provisioning", "failed", "2026-03-10 10:40")
    transition(request, "failed", "provisioning", "2026-03-10 11:00")
    transition(request, "provisioning", "active", "2026-03-10 11:10")

    services.meter_usage(now=at("2026-03-10 13:05"))

    assert figures(unit) == [("10:00", 3600, 1200, 0), ("11:00", 3600, 0, 0)]
    assert figures(never) == [("10:00", 3600, 3600, 0)]


def test_a_unit_withheld_by_its_gpus_and_its_own_instances_events_at_once_is_credited_each_second_once(
    project, other_project, allocate
):
    """A MIG unit's GPU-level event (10:05-10:35) and its own instance's event (10:20-10:50) overlap: each second
    is credited once (10:10-10:50, after the failed time before 10:10), never the two events' sum. The same on
    another cluster's full GPU whose two critical rules overlap (10:00-10:30 and 10:15-10:45)."""
    east = east_gpus(2)
    mig = allocate(project, "2026-03-10 09:00", "2026-03-10 11:00", kind="mig", profile="3g.40gb", gpu=east[1])
    request = mig.pool.request
    transition(request, "approved", "provisioning", "2026-03-10 09:00")
    transition(request, "provisioning", "failed", "2026-03-10 09:20")
    transition(request, "failed", "provisioning", "2026-03-10 10:10")
    transition(request, "provisioning", "active", "2026-03-10 10:15")
    critical(mig.gpu, "2026-03-10 10:05", "2026-03-10 10:35")
    critical(mig.gpu, "2026-03-10 10:20", "2026-03-10 10:50", mig_instance=mig.mig_instance)
    full = allocate(other_project, "2026-03-10 10:00", "2026-03-10 11:00")
    critical(full.gpu, "2026-03-10 10:00", "2026-03-10 10:30")
    critical(full.gpu, "2026-03-10 10:15", "2026-03-10 10:45", rule="ecc_dbe")

    services.meter_usage(now=at("2026-03-10 11:05"))

    expected_mig = [("09:00", 3600, 2400, 0), ("10:00", 3600, 600, 2400)]
    expected_full = [("10:00", 3600, 0, 2700)]
    assert (figures(mig), figures(full)) == (expected_mig, expected_full)
    services.generate_statement(project, month("2026-03"))  # credits are recomputed for the open month
    services.generate_statement(other_project, month("2026-03"))
    assert (figures(mig), figures(full)) == (expected_mig, expected_full)
