"""The metering watermark row: hours are claimed one at a time, and the showback pass (monitoring's final
rollups applied to metered hours) moves its own mark forward, a window at a time, and never back.

The world: two clusters ("billing" from the allocate fixture and "west"), GPU ids that differ from allocation
ids, a pool of three GPUs on both clusters for one project and a MIG unit for another project.
"""

from datetime import timedelta
from decimal import Decimal

import pytest
from billing_helpers import at
from django.db import transaction

from billing import services
from billing.models import MeteringWatermark, UsageRecord
from billing.services import metering
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from monitoring.models import Rollup1h, RollupRun, Series
from pools.models import PoolCluster
from pricing.models import RateCard

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


def west_gpu(index: int) -> GpuCapacity:
    west, _ = Cluster.objects.get_or_create(name="west", defaults={"kubeconfig_path": "/dev/null"})
    node, _ = NodeCapacity.objects.get_or_create(cluster=west, name="west-1", defaults={"gpu_count": 8})
    return GpuCapacity.objects.create(
        node=node, index=index, uuid=f"GPU-west-{index}", product="NVIDIA H100 80GB HBM3", catalog_product="H100-80GB"
    )


@pytest.fixture
def fleet(project, other_project, allocate):
    """Four units metered 10:00-13:00 on 2026-03-10: a three-GPU pool over two clusters, and a MIG unit."""
    spare = [west_gpu(i) for i in range(3)]  # west GPUs first: no GPU id equals an allocation id
    first = allocate(project, "2026-03-10 10:00", "2026-03-10 13:00")
    second = allocate(project, "2026-03-10 10:00", "2026-03-10 13:00", pool=first.pool)
    on_west = allocate(project, "2026-03-10 10:00", "2026-03-10 13:00", pool=first.pool, gpu=spare[1])
    for cluster_id in {first.pool.cluster_id, spare[1].node.cluster_id}:
        PoolCluster.objects.get_or_create(pool=first.pool, cluster_id=cluster_id)
    mig = allocate(other_project, "2026-03-10 10:00", "2026-03-10 13:00", kind="mig", profile="3g.40gb")
    units = [first, second, on_west, mig]
    assert len({u.gpu_id for u in units[:3]}) == 3 and all(u.gpu_id != u.pk for u in units)
    return units


def rollups(units, sm_by_hour: dict[str, float]) -> None:
    """Hourly rollups of every unit's own series (the MIG instance's for a MIG unit)."""
    for unit in units:
        series = Series.objects.create(gpu=unit.gpu, mig_instance=unit.mig_instance)
        for hour, sm in sm_by_hour.items():
            Rollup1h.objects.create(series=series, bucket=at(hour), samples=120, sm_active_avg=sm, power_w_avg=400.0)


def final_until(when: str) -> None:
    RollupRun.objects.update_or_create(level="1h", defaults={"complete_until": at(when)})


def measured_hours() -> list[tuple[str, int]]:
    """(hour, units measured in it) for every metered hour."""
    out = []
    for hour in sorted(set(UsageRecord.objects.values_list("hour", flat=True))):
        count = UsageRecord.objects.filter(hour=hour, sm_activity__isnull=False).count()
        out.append((f"{hour:%H:%M}", count))
    return out


def test_the_showback_pass_measures_each_final_hour_once_and_moves_its_mark(fleet):
    result = services.meter_usage(now=at("2026-03-10 13:05"))
    assert (result.hours, result.records) == (3, 12)
    in_force = RateCard.objects.effective_at(at("2026-03-10 10:00"))
    assert set(UsageRecord.objects.values_list("rate_card_id", flat=True)) == {in_force.pk}
    assert services.catch_up_measurements() == 0  # nothing final yet: nothing to do
    assert MeteringWatermark.objects.get().measured_until is None

    rollups(fleet, {"2026-03-10 10:00": 50.0, "2026-03-10 11:00": 25.0, "2026-03-10 12:00": 75.0})
    final_until("2026-03-10 12:00")

    assert services.catch_up_measurements() == 8  # four units x the two final hours
    assert MeteringWatermark.objects.get().measured_until == at("2026-03-10 12:00")
    assert measured_hours() == [("10:00", 4), ("11:00", 4), ("12:00", 0)]
    assert set(UsageRecord.objects.filter(hour=at("2026-03-10 11:00")).values_list("sm_activity", flat=True)) == {
        Decimal("0.2500")
    }

    final_until("2026-03-10 13:00")
    assert services.catch_up_measurements() == 4  # only the hour that became final
    assert MeteringWatermark.objects.get().measured_until == at("2026-03-10 13:00")
    assert measured_hours() == [("10:00", 4), ("11:00", 4), ("12:00", 4)]
    assert services.catch_up_measurements() == 0


def test_the_showback_pass_takes_at_most_max_hours_per_call(fleet):
    services.meter_usage(now=at("2026-03-10 13:05"))
    rollups(fleet, {"2026-03-10 10:00": 50.0, "2026-03-10 11:00": 25.0, "2026-03-10 12:00": 75.0})
    final_until("2026-03-10 11:00")
    assert services.catch_up_measurements(max_hours=1) == 4
    final_until("2026-03-10 13:00")

    assert services.catch_up_measurements(max_hours=1) == 4
    assert MeteringWatermark.objects.get().measured_until == at("2026-03-10 12:00")
    assert measured_hours() == [("10:00", 4), ("11:00", 4), ("12:00", 0)]
    assert services.catch_up_measurements(max_hours=1) == 4
    assert measured_hours() == [("10:00", 4), ("11:00", 4), ("12:00", 4)]


def test_the_showback_mark_never_moves_back_when_monitorings_final_mark_is_behind_it(fleet):
    services.meter_usage(now=at("2026-03-10 13:05"))
    rollups(fleet, {"2026-03-10 10:00": 50.0, "2026-03-10 11:00": 25.0, "2026-03-10 12:00": 75.0})
    final_until("2026-03-10 13:00")
    assert services.catch_up_measurements() == 12

    final_until("2026-03-10 11:00")  # monitoring rebuilt its rollups and is behind again
    assert services.catch_up_measurements() == 0
    assert MeteringWatermark.objects.get().measured_until == at("2026-03-10 13:00")


class OtherWorkerClaimsFirst:
    """Stands in for metering's `transaction`: just before the first claim, another worker claims and meters that
    hour (its UPDATE and inserts committed first)."""

    def __init__(self):
        self.claimed_by_other = None

    def atomic(self):
        if self.claimed_by_other is None:
            mark = MeteringWatermark.objects.get(pk=1)
            self.claimed_by_other = mark.metered_until
            MeteringWatermark.objects.filter(pk=1).update(metered_until=mark.metered_until + HOUR)
            metering.meter_hour(mark.metered_until)
        return transaction.atomic()


def test_an_hour_another_worker_claimed_is_skipped_and_the_next_one_metered(fleet, monkeypatch):
    services.watermark()  # the row exists before the race
    other = OtherWorkerClaimsFirst()
    monkeypatch.setattr(metering, "transaction", other)

    result = services.meter_usage(now=at("2026-03-10 13:05"))

    assert other.claimed_by_other == at("2026-03-10 10:00")
    assert result.hours_done == [at("2026-03-10 11:00"), at("2026-03-10 12:00")]
    assert (result.hours, result.records, result.metered_until) == (2, 8, at("2026-03-10 13:00"))
    # The other worker metered 10:00 (four rows); this one metered the two hours after it, each unit once.
    assert UsageRecord.objects.count() == 12
    assert measured_hours() == [("10:00", 0), ("11:00", 0), ("12:00", 0)]


def test_reading_the_watermark_once_it_exists_is_one_query(fleet, django_assert_num_queries):
    created = services.watermark()
    assert created.metered_until == at("2026-03-10 10:00")  # the first allocation's hour

    with django_assert_num_queries(1):
        assert services.watermark().pk == created.pk


def test_a_showback_pass_with_no_newly_final_hour_reads_the_two_marks_and_nothing_else(
    fleet, django_assert_num_queries
):
    """meter_usage ends every run with a showback pass; once its mark has reached monitoring's, the pass reads
    monitoring's final mark and the watermark row, and neither scans the records nor writes the row again."""
    services.meter_usage(now=at("2026-03-10 13:05"))
    rollups(fleet, {"2026-03-10 10:00": 50.0, "2026-03-10 11:00": 25.0, "2026-03-10 12:00": 75.0})
    final_until("2026-03-10 13:00")
    assert services.catch_up_measurements() == 12
    assert MeteringWatermark.objects.get().measured_until == at("2026-03-10 13:00")  # monitoring's mark: caught up

    with django_assert_num_queries(2):
        assert services.catch_up_measurements() == 0
    assert MeteringWatermark.objects.get().measured_until == at("2026-03-10 13:00")
