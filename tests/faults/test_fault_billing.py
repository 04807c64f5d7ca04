"""kill -9 of the billing worker while metering and while closing a month: nothing lost, nothing twice."""

from decimal import Decimal

import pytest
from conftest import drive
from django.utils import timezone

from billing import recovery, services
from billing.choices import LineType, RunKind, RunStatus
from billing.models import BillingRun, MeteringWatermark, Statement, StatementLine, UsageRecord
from billing.periods import HOUR, floor_hour, month_bounds
from billing.tasks import meter_usage_task
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from pools.models import Allocation, GpuPool, PoolRequest

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def held_gpus(project, start, end=None, *, count=2) -> GpuPool:
    """An active, provisioned pool of `count` full H100s whose clock runs from `start` to `end`."""
    services.seed_default_card()  # transactional tests flush the card the migration seeded
    cluster = Cluster.objects.create(name="faults", kubeconfig_path="/dev/null")
    node = NodeCapacity.objects.create(cluster=cluster, name="node-1", gpu_count=count)
    request = PoolRequest.objects.create(
        project=project, spec_kind="full", product="H100-80GB", count=count, start_at=start, approved_at=start
    )
    PoolRequest.objects.filter(pk=request.pk).update(state="active")
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=cluster, name="pool-1", workload_type="inference", created_at=start
    )
    GpuPool.objects.filter(pk=pool.pk).update(state="active", provisioned_at=start)
    for index in range(count):
        gpu = GpuCapacity.objects.create(
            node=node, index=index, uuid=f"GPU-{index}", product="NVIDIA H100 80GB HBM3", catalog_product="H100-80GB"
        )
        Allocation.objects.create(
            pool=pool,
            project=project,
            kind="full",
            gpu=gpu,
            resource_name="nvidia.com/gpu",
            product="H100-80GB",
            compute_slices=7,
            allocated_at=start,
            released_at=end,
        )
    return pool


def test_metering_killed_mid_hour_meters_every_hour_exactly_once(project, workers):
    fleet = workers(["billing"], ["metering.hour"])
    hour = floor_hour(timezone.now())
    held_gpus(project, hour - 3 * HOUR)
    meter_usage_task.delay()  # beat's tick

    def done():
        mark = MeteringWatermark.objects.filter(pk=1).first()
        return mark is not None and mark.metered_until == hour and mark.claimed_by == ""

    assert drive(fleet, done, recovery.sweep), fleet.log_tail()

    assert fleet.crashed() == ["metering.hour"]
    assert fleet.killed() == [-9]
    records = UsageRecord.objects.values_list("allocation_id", "hour")
    assert len(records) == 6  # 2 GPUs x 3 complete hours: the killed hour was rolled back, then metered once
    assert len(set(records)) == 6
    assert sorted({h for _, h in records}) == [hour - 3 * HOUR, hour - 2 * HOUR, hour - HOUR]
    run = BillingRun.objects.get(kind=RunKind.METER)
    assert (run.status, run.hours_metered, run.records_written) == (RunStatus.SUCCEEDED, 3, 6)


def test_a_month_close_killed_twice_ends_with_one_statement_billed_once(project, workers):
    fleet = workers(["billing"], ["close.metered", "close.statements"])
    period = services.previous_period()
    _, end = month_bounds(period)
    held_gpus(project, end - 4 * HOUR, end - 2 * HOUR)
    run = services.start_close_run(period)  # enqueued on commit

    def done():
        run.refresh_from_db()
        return run.status != RunStatus.RUNNING

    assert drive(fleet, done, recovery.sweep), fleet.log_tail()

    assert fleet.crashed() == ["close.metered", "close.statements"]
    assert fleet.killed() == [-9, -9]
    assert (run.status, run.statements) == (RunStatus.SUCCEEDED, 1)
    assert UsageRecord.objects.filter(hour__lt=end).count() == 4  # 2 GPUs x 2 hours
    statement = Statement.objects.get()
    assert (statement.project_id, statement.period) == (project.pk, period)
    usage = StatementLine.objects.filter(statement=statement, line_type=LineType.USAGE)
    assert usage.count() == 1
    assert statement.total_amount == Decimal("10.00")  # 4 GPU-hours at 2.50, once
    assert BillingRun.objects.filter(kind=RunKind.CLOSE).count() == 1
