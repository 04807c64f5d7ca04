"""Which path meters an hour (billing/services/metering.py, meter_hour): where the database meters in SQL
(METERS_IN_SQL, PostgreSQL), an hour whose rollups are not final yet has its plain units metered by one INSERT ...
SELECT; an hour monitoring has finalised goes through Python, which applies the measurements at once. Units a
credit may touch go through Python either way.

The SQL path is replaced here by a recorder (the SQLite backend has none), so the decision itself is what is
checked, on any database. The world: two clusters, two projects, GPU ids unlike allocation ids.
"""

from datetime import timedelta
from decimal import Decimal

import pytest
from billing_helpers import at
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import backends
from billing.models import UsageRecord
from billing.services import metering
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from monitoring.models import Rollup1h, RollupRun, Series
from pools.models import GpuPool

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


@pytest.fixture
def sql_path(monkeypatch):
    """Pretend the database meters in SQL; record the allocation ids and hour each SQL metering was given."""
    calls: list[tuple[str, list[int]]] = []

    def meter_plain(allocations, hour, end, book):
        assert end == hour + HOUR
        calls.append((f"{hour:%H:%M}", sorted(allocations.values_list("pk", flat=True))))
        return 0

    monkeypatch.setattr(backends, "METERS_IN_SQL", True)
    monkeypatch.setattr(metering, "_meter_plain", meter_plain)
    return calls


@pytest.fixture
def world(project, other_project, allocate):
    """A plain unit on the "west" cluster and, on the fixture's cluster, another project's unit whose pool failed."""
    west = Cluster.objects.create(name="west", kubeconfig_path="/dev/null")
    node = NodeCapacity.objects.create(cluster=west, name="west-1", gpu_count=8)
    gpus = [
        GpuCapacity.objects.create(
            node=node, index=i, uuid=f"GPU-west-{i}", product="NVIDIA H100 80GB HBM3", catalog_product="H100-80GB"
        )
        for i in range(3)
    ]
    plain = allocate(project, "2026-03-10 09:00", gpu=gpus[2])
    failed = allocate(other_project, "2026-03-10 09:00", request_state="failed")
    GpuPool.objects.filter(pk=failed.pool_id).update(state="failed")
    assert plain.gpu_id != plain.pk and failed.gpu_id != failed.pk
    return plain, failed


def metered(allocation) -> list[str]:
    hours = UsageRecord.objects.filter(allocation=allocation).order_by("hour").values_list("hour", flat=True)
    return [f"{hour:%H:%M}" for hour in hours]


def test_only_hours_not_final_yet_are_metered_in_sql(world, sql_path):
    plain, failed = world
    RollupRun.objects.update_or_create(level="1h", defaults={"complete_until": at("2026-03-10 11:00")})

    for hour in ("2026-03-10 09:00", "2026-03-10 10:00", "2026-03-10 11:00", "2026-03-10 12:00"):
        metering.meter_hour(at(hour))

    assert sql_path == [("11:00", [plain.pk]), ("12:00", [plain.pk])]  # from the first hour not final
    assert metered(plain) == ["09:00", "10:00"]  # the final hours, in Python
    assert metered(failed) == ["09:00", "10:00", "11:00", "12:00"]  # credited: Python every hour
    assert set(UsageRecord.objects.filter(allocation=failed).values_list("failed_credit_seconds", flat=True)) == {3600}


def test_with_no_final_rollups_every_plain_hour_is_metered_in_sql(world, sql_path):
    plain, failed = world
    assert not RollupRun.objects.exists()

    metering.meter_hour(at("2026-03-10 09:00"))
    metering.meter_hour(at("2026-03-10 10:00"), in_sql=False)  # asked for Python: Python

    assert sql_path == [("09:00", [plain.pk])]
    # The recorder wrote no row for 09:00, so Python found the unit without a record and backfilled it.
    assert (metered(plain), metered(failed)) == (["09:00", "10:00"], ["09:00", "10:00"])


def test_a_unit_on_a_gpu_with_a_critical_event_in_the_hour_goes_through_python(world, sql_path, allocate, project):
    from monitoring.models import HealthEvent

    plain, failed = world
    sick = allocate(project, "2026-03-10 09:00", pool=plain.pool)
    HealthEvent.objects.create(
        gpu=sick.gpu,
        rule="xid_critical",
        level="critical",
        opened_at=at("2026-03-10 11:20"),
        last_seen_at=at("2026-03-10 11:20"),
        resolved_at=at("2026-03-10 11:50"),
    )
    metering.meter_hour(at("2026-03-10 09:00"))
    metering.meter_hour(at("2026-03-10 11:00"))

    assert sql_path == [("09:00", [plain.pk, sick.pk]), ("11:00", [plain.pk])]
    sick_hours = UsageRecord.objects.filter(allocation=sick).order_by("hour")
    assert list(sick_hours.values_list("health_credit_seconds", flat=True)) == [0, 0, 1800]  # 10:00 backfilled


def test_sql_metering_prices_each_spec_as_the_price_book_does(world, monkeypatch):
    """The SQL path hands the distinct specs of the hour's plain units to `price`; each comes back with the record's
    spec and the PriceBook's rate for it (a time-slice replica on a 4-replica node pays a quarter)."""
    from decimal import Decimal

    from pricing.services import PriceBook

    given = []

    def meter_plain_hour(sql, params, hour, end, price, card_id):
        specs = [("full", "H100-80GB", "", 4, 7), ("timeslice", "H100-80GB", "", 4, 7)]
        given.append((hour, end, card_id, price(specs)))
        return len(specs)

    monkeypatch.setattr(backends, "meter_plain_hour", meter_plain_hour)
    book = PriceBook()
    hour = at("2026-03-10 11:00")
    assert metering._meter_plain(metering.Allocation.objects.all(), hour, hour + HOUR, book) == 2

    card = book.card_at(hour)
    ((when, end, card_id, priced),) = given
    assert (when, end, card_id) == (hour, hour + HOUR, card.pk)
    assert [row[:5] for row in priced] == [("full", "H100-80GB", "", 4, 7), ("timeslice", "H100-80GB", "", 4, 7)]
    assert [row[-1] for row in priced] == [Decimal("2.50"), Decimal("0.625")]


def test_a_unit_with_no_record_is_backfilled_only_if_it_started_within_the_late_window(
    project, other_project, allocate
):
    """meter_hour backfills a unit with no record yet from its first hour when it started (or finished provisioning)
    at most LATE_ALLOCATION_WINDOW (31 days) before the hour: exactly 31 days before is backfilled, an hour more
    is not (only the hour being metered is)."""
    hour = at("2026-03-10 10:00")
    inside = allocate(project, hour - metering.LATE_ALLOCATION_WINDOW, hour + HOUR)
    outside = allocate(other_project, hour - metering.LATE_ALLOCATION_WINDOW - HOUR, hour + HOUR)
    assert metering.LATE_ALLOCATION_WINDOW == timedelta(days=31)

    metering.meter_hour(hour, in_sql=False)

    assert UsageRecord.objects.filter(allocation=inside).count() == 31 * 24 + 1
    assert list(UsageRecord.objects.filter(allocation=outside).values_list("hour", flat=True)) == [hour]


def test_meter_hour_measures_the_hours_monitoring_has_finalised_and_only_those(world):
    """meter_hour itself applies the final rollups (no showback pass runs here): one call that meters 11:00 and
    backfills 09:00 and 10:00 measures the two final hours of each unit and leaves 11:00, not final yet, unmeasured."""
    plain, failed = world
    for allocation, sm in ((plain, 40.0), (failed, 80.0)):
        series = Series.objects.create(gpu=allocation.gpu)
        for hour in ("2026-03-10 09:00", "2026-03-10 10:00", "2026-03-10 11:00"):
            Rollup1h.objects.create(series=series, bucket=at(hour), samples=120, sm_active_avg=sm, power_w_avg=500.0)
    RollupRun.objects.update_or_create(level="1h", defaults={"complete_until": at("2026-03-10 11:00")})

    metering.meter_hour(at("2026-03-10 11:00"))

    def measured(allocation) -> list[tuple]:
        rows = UsageRecord.objects.filter(allocation=allocation).order_by("hour")
        return [(f"{h:%H:%M}", sm, kwh) for h, sm, kwh in rows.values_list("hour", "sm_activity", "energy_kwh")]

    assert measured(plain) == [
        ("09:00", Decimal("0.4000"), Decimal("0.500000")),
        ("10:00", Decimal("0.4000"), Decimal("0.500000")),
        ("11:00", None, None),
    ]
    assert measured(failed) == [
        ("09:00", Decimal("0.8000"), Decimal("0.500000")),
        ("10:00", Decimal("0.8000"), Decimal("0.500000")),
        ("11:00", None, None),
    ]


def test_a_backfill_reads_monitoring_s_final_mark_once_not_once_per_hour(world):
    """Metering five hours at once (09:00 to 13:00) when only 09:00 is final reads monitoring's mark three times:
    to choose the SQL path, once for the batch, and to measure 09:00. The hours not final yet (10:00, the mark
    itself, and later) cost no read each: a backfill of days stays one read, not one per hour."""
    plain, failed = world
    for allocation in (plain, failed):
        series = Series.objects.create(gpu=allocation.gpu)
        Rollup1h.objects.create(series=series, bucket=at("2026-03-10 09:00"), samples=120, sm_active_avg=50.0)
    RollupRun.objects.update_or_create(level="1h", defaults={"complete_until": at("2026-03-10 10:00")})

    with CaptureQueriesContext(connection) as queries:
        metering.meter_hour(at("2026-03-10 13:00"))

    mark_reads = [q["sql"] for q in queries.captured_queries if RollupRun._meta.db_table in q["sql"]]
    assert len(mark_reads) == 3, mark_reads
    hours = UsageRecord.objects.filter(allocation=plain).order_by("hour").values_list("hour", "sm_activity")
    assert [(f"{h:%H:%M}", sm) for h, sm in hours] == [
        ("09:00", Decimal("0.5000")),
        ("10:00", None),
        ("11:00", None),
        ("12:00", None),
        ("13:00", None),
    ]
