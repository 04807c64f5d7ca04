"""Statement lines in a world shaped like a real fleet: two clusters, ids that differ across tables, multi-device
pools, mixed products and tiers. Each test pins a behaviour a one-change mutant of billing/services/lines.py or
statements.py would break (tests/billing/EQUIVALENT_MUTANTS.md lists the mutants no test can tell apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services
from billing.choices import LineType
from billing.models import Statement, StatementLine, UsageRecord
from pricing.rates import spec_key
from pricing.services import PriceBook

pytestmark = pytest.mark.django_db


@dataclass
class Fleet:
    east: object
    west: object
    h100_full: object  # west, tier "full": a full-GPU node
    a100_mig_gpu: object  # east, tier 1: an A100 carved into MIG
    mig_3g: object  # a 3g.40gb on a100_mig_gpu
    spare_gpus: list


@pytest.fixture
def fleet(db):
    """Two clusters. Padding rows first, so no table's first id equals another's (a GPU id is never a MIG id)."""
    from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity

    east = Cluster.objects.create(name="east", kubeconfig_path="/dev/null")
    west = Cluster.objects.create(name="west", kubeconfig_path="/dev/null")
    east_node = NodeCapacity.objects.create(cluster=east, name="east-a100-0", gpu_count=8, tier="1")
    west_node = NodeCapacity.objects.create(cluster=west, name="west-h100-0", gpu_count=8, tier="full")
    spare = [
        GpuCapacity.objects.create(node=west_node, index=i, uuid=f"GPU-w{i}", catalog_product="H100-80GB")
        for i in range(5)
    ]
    h100 = GpuCapacity.objects.create(node=west_node, index=5, uuid="GPU-w5", catalog_product="H100-80GB")
    a100 = GpuCapacity.objects.create(node=east_node, index=0, uuid="GPU-e0", catalog_product="A100-80GB")
    profile = MigProfile.objects.get(product="A100-80GB", name="3g.40gb")
    placement = profile.valid_placements.order_by("start").first()
    mig = MigInstance.objects.create(
        gpu=a100,
        profile=profile,
        placement=placement,
        placement_start=placement.start,
        placement_size=placement.size,
        uuid="MIG-e0-3g",
    )
    assert len({h100.pk, a100.pk, mig.pk}) == 3 and mig.pk not in {h100.pk, a100.pk}
    return Fleet(east, west, h100, a100, mig, spare)


def _pool(project, cluster, *, product, kind="full", profile="", name="pool"):
    from pools.models import GpuPool, PoolRequest

    request = PoolRequest.objects.create(
        project=project,
        spec_kind=kind,
        product=product,
        profile_name=profile,
        start_at=at("2026-03-01 00:00"),
        approved_at=at("2026-03-01 00:00"),
    )
    PoolRequest.objects.filter(pk=request.pk).update(state="active")
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=cluster, name=name, workload_type="training"
    )
    GpuPool.objects.filter(pk=pool.pk).update(state="active", provisioned_at=at("2026-03-01 00:00"))
    pool.refresh_from_db()
    return pool


def _allocation(pool, gpu, start, end=None, *, mig=None, end_reason=""):
    from pools.models import Allocation

    allocation = Allocation.objects.create(
        pool=pool,
        project=pool.project,
        kind="mig" if mig else "full",
        gpu=gpu,
        mig_instance=mig,
        resource_name="nvidia.com/gpu",
        product=gpu.catalog_product,
        profile_name=mig.profile.name if mig else "",
        compute_slices=mig.profile.compute_slices if mig else 7,
        allocated_at=at(start),
        released_at=at(end) if end else None,
    )
    if end_reason:
        Allocation.objects.filter(pk=allocation.pk).update(end_reason=end_reason)
    return allocation


def _trespass(fleet, *, project, owner, started, ended=None, mig=True):
    from monitoring.models import TrespassEvent

    unit = fleet.mig_3g if mig else None
    return TrespassEvent.objects.create(
        kind="foreign_pod",
        gpu=fleet.a100_mig_gpu if mig else fleet.h100_full,
        mig_instance=unit,
        unit_key=f"mig:{unit.pk}" if mig else f"gpu:{fleet.h100_full.pk}",
        owner_project=owner,
        project=project,
        namespace=project.namespace if project else "",
        pod_name="sneaky-0",
        pod_uid=f"uid-{started}",
        started_at=at(started),
        last_seen_at=at(started),
        ended_at=at(ended) if ended else None,
    )


def _lines(statement, line_type):
    return list(StatementLine.objects.filter(statement=statement, line_type=line_type).order_by("pk"))


def test_a_project_that_only_trespassed_gets_a_statement_at_the_list_rate(fleet, project, other_project):
    """other_project holds nothing and only trespassed on project's 3g.40gb for 1 h 30 min: it still gets a
    statement, charged the unit's list rate; the owner's statement has no trespass line."""
    services.seed_default_card()
    owner_pool = _pool(project, fleet.east, product="A100-80GB", kind="mig", profile="3g.40gb")
    _allocation(owner_pool, fleet.a100_mig_gpu, "2026-03-10 00:00", "2026-03-10 06:00", mig=fleet.mig_3g)
    event = _trespass(fleet, project=other_project, owner=project, started="2026-03-10 01:15", ended="2026-03-10 02:45")
    _trespass(fleet, project=None, owner=project, started="2026-03-10 03:00", ended="2026-03-10 04:00")
    services.meter_usage(now=at("2026-03-10 07:00"))

    statements = {s.project_id: s for s in services.generate_statements(month("2026-03"))}

    assert set(statements) == {project.pk, other_project.pk}
    book = PriceBook()
    rate = book.price(book.card_at(at("2026-03-10 01:00")), spec_key("mig", "A100-80GB", "3g.40gb"), 3)
    assert rate == Decimal("0.800000")  # an A100-80GB 3g.40gb is half the GPU (memory share)
    (line,) = _lines(statements[other_project.pk], LineType.TRESPASS)
    assert (line.hours, line.amount, line.hourly_rate) == (Decimal("1.5000"), Decimal("1.20"), rate)
    assert (line.kind, line.product, line.profile_name) == ("mig", "A100-80GB", "3g.40gb")
    assert "east-a100-0" in line.description and "another project's" in line.description
    assert line.reason == f"trespass event #{event.pk} from 2026-03-10 01:15:00 UTC"
    assert statements[other_project.pk].total_amount == Decimal("1.20")
    assert _lines(statements[project.pk], LineType.TRESPASS) == []
    assert statements[project.pk].reserved_amount == Decimal("4.80")  # 6 h x 0.80: the owner still pays its hold


def test_trespass_is_clipped_to_the_month_and_an_open_one_runs_to_now(fleet, project, other_project):
    """A trespass from the last 30 min of February to 01:00 on 1 March bills March 1 h; one still open from
    31 March 23:00 bills March until the month's end, and April's open one the whole rest of April."""
    services.seed_default_card()
    _trespass(fleet, project=other_project, owner=project, started="2026-02-28 23:30", ended="2026-03-01 01:00")
    _trespass(fleet, project=other_project, owner=None, started="2026-03-31 23:00", mig=False)
    _trespass(fleet, project=project, owner=other_project, started="2026-04-02 10:00", mig=False)

    statements = {s.project_id: s for s in services.generate_statements(month("2026-03"))}
    april = services.generate_statement(project, month("2026-04"))

    hours = sorted(line.hours for line in _lines(statements[other_project.pk], LineType.TRESPASS))
    assert hours == [Decimal("1.0000"), Decimal("1.0000")]
    full = [x for x in _lines(statements[other_project.pk], LineType.TRESPASS) if x.kind == "full"]
    assert [(x.amount, "an unallocated" in x.description) for x in full] == [(Decimal("2.50"), True)]
    assert project.pk not in statements  # its only trespass is in April
    (open_line,) = _lines(april, LineType.TRESPASS)  # still open, and April is over: billed to 1 May 00:00
    assert (open_line.hours, open_line.amount) == (Decimal("686.0000"), Decimal("1715.00"))


def test_a_unit_that_ended_early_gets_a_notice_line_that_charges_nothing(fleet, project, other_project):
    """Two GPUs of one pool; one ended early (its MIG instance destroyed): a notice line at 0.00, and the
    statement bills only the time it ran. A unit released normally, or in another month, gets no notice."""
    services.seed_default_card()
    pool = _pool(project, fleet.west, product="H100-80GB", name="train")
    _allocation(pool, fleet.h100_full, "2026-03-10 10:00", "2026-03-10 12:00")
    gone = _allocation(
        pool, fleet.spare_gpus[0], "2026-03-10 10:00", "2026-03-10 11:00", end_reason="MIG instance destroyed"
    )
    other_pool = _pool(other_project, fleet.west, product="H100-80GB", name="later")
    _allocation(other_pool, fleet.spare_gpus[1], "2026-04-01 00:00", "2026-04-01 01:00", end_reason="destroyed")
    services.meter_usage(now=at("2026-04-01 02:00"))

    statements = {s.project_id: s for s in services.generate_statements(month("2026-03"))}

    assert set(statements) == {project.pk}
    statement = statements[project.pk]
    (notice,) = _lines(statement, LineType.NOTICE)
    assert (notice.amount, notice.reason, notice.pool_id) == (Decimal("0.00"), "MIG instance destroyed", pool.pk)
    assert notice.hours == Decimal("0.0000") and notice.hourly_rate is None
    assert "billed until 2026-03-10 11:00:00 UTC" in notice.description and "train" in notice.description
    assert gone.pk in UsageRecord.objects.values_list("allocation", flat=True)
    assert (statement.reserved_amount, statement.total_amount) == (Decimal("7.50"), Decimal("7.50"))


def test_late_records_of_one_project_stay_off_another_projects_statement(fleet, project, other_project):
    """project's March is finalised, other_project's March is a draft. Late March records of both arrive:
    project's go on its April statement as carry-over; other_project's stay on its March draft, never on
    project's April statement or its own April statement."""
    services.seed_default_card()
    pool_a = _pool(project, fleet.west, product="H100-80GB", name="a")
    pool_b = _pool(other_project, fleet.east, product="A100-80GB", name="b")
    _allocation(pool_a, fleet.h100_full, "2026-03-05 10:00", "2026-03-05 11:00")
    _allocation(pool_b, fleet.a100_mig_gpu, "2026-03-05 10:00", "2026-03-05 11:00")
    services.meter_usage(now=at("2026-04-01 01:00"))
    march = {s.project_id: s for s in services.generate_statements(month("2026-03"))}
    services.finalise_statement(march[project.pk])
    # Late usage of March for both projects (backdated allocations), metered after the close.
    _allocation(pool_a, fleet.spare_gpus[0], "2026-03-31 22:00", "2026-04-01 00:00")
    _allocation(pool_b, fleet.spare_gpus[1], "2026-03-31 21:00", "2026-04-01 00:00")
    services.meter_usage(now=at("2026-04-01 03:00"))

    april = {s.project_id: s for s in services.generate_statements(month("2026-04"))}
    march_b = services.generate_statement(other_project, month("2026-03"))

    (carry,) = _lines(april[project.pk], LineType.CARRY_OVER)
    assert (carry.hours, carry.amount, carry.usage_period, carry.pool_id) == (
        Decimal("2.0000"),
        Decimal("5.00"),
        month("2026-03"),
        pool_a.pk,
    )
    assert {line.pool_id for line in april[project.pk].lines.all()} == {pool_a.pk}
    assert other_project.pk not in april  # nothing of its own in April, and its late March is not carried
    assert march_b.reserved_hours == Decimal("4.0000") and march_b.reserved_amount == Decimal("9.10")  # 1.60 + 3 x 2.50
    assert not Statement.objects.filter(project=other_project, period=month("2026-04")).exists()


def test_a_daytime_off_peak_window_is_labelled_off_peak_on_the_statement(fleet, project):
    """A window that does not wrap midnight (09 -> 17): its hours are grouped and labelled off-peak; the hour
    before it and the hour at its end are not."""
    card = services.create_rate_card(
        name="Day discount", effective_from=at("2026-03-01 00:00"), full_prices={"H100-80GB": Decimal("2.00")}
    )
    from pricing.models import RateCard

    RateCard.objects.filter(pk=card.pk).update(
        off_peak_start_hour=9, off_peak_end_hour=17, off_peak_multiplier=Decimal("0.500")
    )
    pool = _pool(project, fleet.west, product="H100-80GB", name="day")
    _allocation(pool, fleet.h100_full, "2026-03-10 08:00", "2026-03-10 10:00")  # 08 peak, 09 off-peak
    _allocation(pool, fleet.spare_gpus[2], "2026-03-10 16:00", "2026-03-10 18:00")  # 16 off-peak, 17 peak
    services.meter_usage(now=at("2026-03-10 19:00"))

    statement = services.generate_statement(project, month("2026-03"))

    lines = sorted((x.description.split(": ", 1)[1], x.hours, x.amount) for x in _lines(statement, LineType.USAGE))
    assert lines == [
        ("H100-80GB full GPU @ 1/h off-peak", Decimal("2.0000"), Decimal("2.00")),
        ("H100-80GB full GPU @ 2/h", Decimal("2.0000"), Decimal("4.00")),
    ]


def test_a_health_credit_overlapping_a_failed_credit_credits_each_second_once(fleet, project):
    """Failed 10:10-10:50 and a critical health event 10:00-10:20 and 10:40-11:30 on a unit held 10:00-11:00
    and 11:00-11:30: health credits only the seconds not already failed-credited (10:00-10:10, 10:50-11:30)."""
    from billing_helpers import transition

    from monitoring.models import HealthEvent

    services.seed_default_card()
    pool = _pool(project, fleet.west, product="H100-80GB", name="hc")
    _allocation(pool, fleet.h100_full, "2026-03-10 10:00", "2026-03-10 11:30")
    for opened, resolved in (("10:00", "10:20"), ("10:40", "11:30")):
        HealthEvent.objects.create(
            gpu=fleet.h100_full,
            rule="xid_critical",
            level="critical",
            opened_at=at(f"2026-03-10 {opened}"),
            last_seen_at=at(f"2026-03-10 {opened}"),
            resolved_at=at(f"2026-03-10 {resolved}"),
        )
    transition(pool.request, "active", "failed", "2026-03-10 10:10")
    transition(pool.request, "failed", "active", "2026-03-10 10:50")

    services.meter_usage(now=at("2026-03-10 12:00"))
    statement = services.generate_statement(project, month("2026-03"))

    rows = list(
        UsageRecord.objects.order_by("hour").values_list("seconds", "failed_credit_seconds", "health_credit_seconds")
    )
    assert rows == [(3600, 2400, 1200), (1800, 0, 1800)]
    (health,) = _lines(statement, LineType.HEALTH_CREDIT)
    (failed,) = _lines(statement, LineType.FAILED_CREDIT)
    assert (health.hours, health.amount, failed.hours, failed.amount) == (
        Decimal("0.8333"),
        Decimal("-2.08"),
        Decimal("0.6667"),
        Decimal("-1.67"),
    )
    assert statement.total_amount == Decimal("3.75") - Decimal("2.08") - Decimal("1.67")


def test_billing_time_starts_at_the_default_cards_epoch(db):
    """The migration seeds the default card at 2000-01-01 00:00 UTC (billing's EPOCH): seeding again finds it,
    creates nothing, and usage from that first hour is priced by it."""
    from datetime import UTC, datetime

    from pricing.models import RateCard

    card, created = services.seed_default_card()

    assert (created, card.effective_from) == (False, datetime(2000, 1, 1, tzinfo=UTC))
    assert services.EPOCH == datetime(2000, 1, 1, tzinfo=UTC)
    assert RateCard.objects.count() == 1
    assert PriceBook().card_at(datetime(2000, 1, 1, tzinfo=UTC)) == card


def test_a_trespass_on_a_time_sliced_gpu_pays_one_replicas_share(fleet, project, other_project):
    """The H100's node is time-sliced 4 ways: a trespass of 2 h there pays a quarter of the GPU's list rate."""
    from capacity.models import NodeCapacity

    services.seed_default_card()
    NodeCapacity.objects.filter(pk=fleet.h100_full.node_id).update(timeslice_replicas=4)
    _trespass(
        fleet, project=other_project, owner=project, started="2026-03-10 10:00", ended="2026-03-10 12:00", mig=False
    )

    (statement,) = services.generate_statements(month("2026-03"))

    (line,) = _lines(statement, LineType.TRESPASS)
    assert statement.project == other_project
    assert (line.kind, line.replicas, line.hourly_rate) == ("timeslice", 4, Decimal("0.625000"))
    assert (line.hours, line.amount, statement.total_amount) == (Decimal("2.0000"), Decimal("1.25"), Decimal("1.25"))


def test_month_to_date_lines_are_the_unbilled_usage_of_the_projects_asked_for(fleet, project, other_project):
    """draft_lines (the dashboard's month-to-date costs): a project's finalised (billed) usage is not there, and
    `project_ids` keeps only those projects' groups."""
    from tenancy.models import Project

    third = Project.objects.create(name="Team C", slug="team-c", namespace="team-c")
    services.seed_default_card()
    for n, who in enumerate((project, other_project, third)):
        pool = _pool(who, fleet.west, product="H100-80GB", name=f"p{n}")
        _allocation(pool, fleet.spare_gpus[n], "2026-03-10 10:00", f"2026-03-10 1{n + 1}:00")  # 1, 2 and 3 hours
    services.meter_usage(now=at("2026-04-01 00:00"))
    services.finalise_statement(services.generate_statement(project, month("2026-03")))

    def billed(**kw):
        return sorted(
            (row["project_id"], lines[0].amount) for row, lines in services.draft_lines(month("2026-03"), **kw)
        )

    assert billed() == sorted([(other_project.pk, Decimal("5.00")), (third.pk, Decimal("7.50"))])
    assert billed(project_ids=[other_project.pk]) == [(other_project.pk, Decimal("5.00"))]
    assert billed(project_ids=[project.pk]) == []


def test_a_long_carried_over_vgpu_line_and_its_credit_are_cut_to_200_characters():
    """A 100-character pool name, a vGPU label naming its licence, off-peak and carried over: over 200 characters,
    so the description keeps the first 200 (the column's length); the money is unaffected."""
    from datetime import date

    from billing.services.lines import lines_for

    row = {
        "pool_id": None,
        "kind": "vgpu",
        "product": "H100-80GB",
        "profile_name": "H100XM-20C",
        "replicas": 4,
        "hourly_rate": Decimal("0.725000"),
        "usage_period": date(2026, 3, 1),
        "off_peak": True,
        "vgpu_licence": Decimal("0.100000"),
        "total_seconds": 7200,
        "measured_seconds": None,
        "sm_seconds": None,
        "energy": None,
        "failed_seconds": 1800,
        "health_seconds": 0,
    }
    usage, credit = lines_for(None, row, "p" * 100)

    assert usage.description.startswith("carry-over from 2026-03: " + "p" * 100 + ": H100-80GB vGPU H100XM-20C")
    assert credit.description.startswith("carry-over from 2026-03: Credit (provisioning failed) " + "p" * 100)
    assert len(usage.description) == len(credit.description) == 200
    assert (usage.amount, usage.hours, credit.amount, credit.hours) == (
        Decimal("1.45"),
        Decimal("2.0000"),
        Decimal("-0.36"),
        Decimal("0.5000"),
    )


def test_a_trespass_of_one_second_still_gets_its_line(fleet, project, other_project):
    services.seed_default_card()
    _trespass(fleet, project=other_project, owner=project, started="2026-03-10 10:00:00", ended="2026-03-10 10:00:01")

    (statement,) = services.generate_statements(month("2026-03"))

    (line,) = _lines(statement, LineType.TRESPASS)
    assert (statement.project, line.hours, line.hourly_rate) == (other_project, Decimal("0.0003"), Decimal("0.800000"))
    assert line.amount == Decimal("0.00")
    assert line.description.startswith(f"Trespass: {other_project.namespace}/sneaky-0 used another project's")


def test_a_trespass_shorter_than_a_second_gets_no_line_and_one_without_a_pod_says_so(fleet, project, other_project):
    services.seed_default_card()
    _trespass(fleet, project=other_project, owner=project, started="2026-03-10 10:00:00", ended="2026-03-10 10:00:00.5")
    unnamed = _trespass(
        fleet, project=project, owner=None, started="2026-03-11 10:00", ended="2026-03-11 11:00", mig=False
    )
    TrespassEvent = type(unnamed)
    TrespassEvent.objects.filter(pk=unnamed.pk).update(pod_name="")

    statements = {s.project_id: s for s in services.generate_statements(month("2026-03"))}

    assert _lines(statements[other_project.pk], LineType.TRESPASS) == []  # under a second: nothing to charge
    assert statements[other_project.pk].total_amount == Decimal("0.00")
    (line,) = _lines(statements[project.pk], LineType.TRESPASS)
    assert line.description.startswith("Trespass: unknown pod used an unallocated H100-80GB full GPU")
    assert (line.hours, line.amount) == (Decimal("1.0000"), Decimal("2.50"))


def test_an_off_peak_window_that_starts_where_it_ends_is_no_window(fleet, project):
    """A card whose off-peak hours are 5 -> 5 has no off-peak hour: every hour is billed at the peak rate."""
    card = services.create_rate_card(
        name="Empty window", effective_from=at("2026-03-01 00:00"), full_prices={"H100-80GB": Decimal("2.00")}
    )
    from pricing.models import RateCard

    RateCard.objects.filter(pk=card.pk).update(
        off_peak_start_hour=5, off_peak_end_hour=5, off_peak_multiplier=Decimal("0.500")
    )
    pool = _pool(project, fleet.west, product="H100-80GB", name="flat")
    _allocation(pool, fleet.h100_full, "2026-03-10 04:00", "2026-03-10 07:00")  # 04, 05 and 06: all peak
    services.meter_usage(now=at("2026-03-10 08:00"))

    statement = services.generate_statement(project, month("2026-03"))

    lines = [(x.description, x.hours, x.amount) for x in _lines(statement, LineType.USAGE)]
    assert lines == [("flat: H100-80GB full GPU @ 2/h", Decimal("3.0000"), Decimal("6.00"))]
