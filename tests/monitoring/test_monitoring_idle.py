"""Idle reservations: flagged below the SM threshold over the window, cleared when busy, released in one step."""

from datetime import timedelta

import pytest
from monitoring_helpers import T0, allocate, series_of

from monitoring.choices import IdleProposal, IdleState
from monitoring.models import IdleReservation
from monitoring.services.idle import detect_idle, dismiss, release_idle
from monitoring.services.ingest import ingest_samples, sample_row
from pools.services import release_allocation

pytestmark = pytest.mark.django_db

NOW = T0 + timedelta(days=1)


def fill(sid, *, sm, mem=500, hours=24, every_s=300, util=None):
    """Samples every `every_s` over the window before NOW (one every 5 min is plenty for averages)."""
    rows = []
    for i in range(hours * 3600 // every_s):
        values = {"sm_active": sm, "mem_used_mib": mem}
        if util is not None:
            values = {"gpu_util": util, "mem_used_mib": mem}
        rows.append(sample_row(sid, NOW - timedelta(seconds=every_s * (i + 1)), values))
    ingest_samples(rows)


@pytest.fixture
def coverage_per_5_minutes(settings):
    settings.METRICS_INTERVAL_S = 300  # the fill above writes one sample per 5 minutes
    settings.MONITORING_IDLE_SM_PCT = 5
    settings.MONITORING_IDLE_WINDOW_H = 24
    settings.MONITORING_IDLE_MIN_COVERAGE_PCT = 50
    settings.MONITORING_IDLE_MEM_MIB = 1024


def test_an_idle_mig_instance_is_flagged_with_a_release_proposal(fleet, project, coverage_per_5_minutes):
    allocation = allocate(project, fleet.mig_3g)
    fill(series_of(fleet.mig_gpu, fleet.mig_3g), sm=2.0)
    assert detect_idle(now=NOW) == {"assessed": 1, "flagged": 1, "cleared": 0, "no_data": 0}
    flag = IdleReservation.objects.get()
    assert (flag.allocation, flag.state, flag.proposal, flag.suggested_profile) == (
        allocation,
        IdleState.OPEN,
        IdleProposal.RELEASE,
        "",
    )
    assert (flag.sm_active_avg, flag.coverage, flag.window_start, flag.window_end) == (
        2.0,
        1.0,
        NOW - timedelta(hours=24),
        NOW,
    )
    assert detect_idle(now=NOW) == {"assessed": 1, "flagged": 0, "cleared": 0, "no_data": 0}  # idempotent
    assert IdleReservation.objects.count() == 1


def test_memory_in_use_proposes_the_smallest_profile_that_holds_it(fleet, project, coverage_per_5_minutes):
    allocate(project, fleet.mig_3g)
    fill(series_of(fleet.mig_gpu, fleet.mig_3g), sm=1.0, mem=9500)  # 1g.10gb (9984 MiB) lacks 10 % headroom
    detect_idle(now=NOW)
    flag = IdleReservation.objects.get()
    assert (flag.proposal, flag.suggested_profile, flag.mem_used_max_mib) == (IdleProposal.DOWNSIZE, "1g.20gb", 9500)


def test_a_full_gpu_without_sm_activity_is_judged_by_utilisation(fleet, project, coverage_per_5_minutes):
    allocate(project, fleet.full_gpu)
    fill(series_of(fleet.full_gpu), sm=None, util=1)
    detect_idle(now=NOW)
    assert IdleReservation.objects.get().sm_active_avg == 1.0


def test_busy_units_missing_data_and_young_allocations_are_not_flagged(fleet, project, coverage_per_5_minutes):
    allocate(project, fleet.mig_3g)
    allocate(project, fleet.mig_2g)
    allocate(project, fleet.mig_1g, at=NOW - timedelta(hours=2))  # held for less than the window
    fill(series_of(fleet.mig_gpu, fleet.mig_3g), sm=60.0)
    fill(series_of(fleet.mig_gpu, fleet.mig_2g), sm=0.5, hours=10)  # 10 of 24 h covered: not enough data
    fill(series_of(fleet.mig_gpu, fleet.mig_1g), sm=0.0)
    assert detect_idle(now=NOW) == {"assessed": 1, "flagged": 0, "cleared": 0, "no_data": 1}
    assert not IdleReservation.objects.exists()


def test_a_flag_clears_when_the_unit_is_busy_again(fleet, project, coverage_per_5_minutes):
    allocate(project, fleet.mig_3g)
    sid = series_of(fleet.mig_gpu, fleet.mig_3g)
    fill(sid, sm=1.0)
    detect_idle(now=NOW)
    busy = [sample_row(sid, NOW + timedelta(minutes=5 * i), {"sm_active": 100.0}) for i in range(36)]
    ingest_samples(busy)  # three busy hours lift the 24 h average to about 13 %
    assert detect_idle(now=NOW + timedelta(hours=3))["cleared"] == 1
    assert IdleReservation.objects.get().state == IdleState.CLEARED


def test_release_of_a_pools_last_unit_releases_the_request(
    fleet, project, operator, coverage_per_5_minutes, django_capture_on_commit_callbacks
):
    from pools.models import PoolRequest

    allocation = allocate(project, fleet.mig_3g)
    PoolRequest.objects.filter(pk=allocation.pool.request_id).update(state="active")
    fill(series_of(fleet.mig_gpu, fleet.mig_3g), sm=1.0)
    detect_idle(now=NOW)
    flag = IdleReservation.objects.get()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert release_idle(flag.pk, actor=operator) is True
    allocation.refresh_from_db()
    flag.refresh_from_db()
    assert allocation.released_at is not None
    assert (flag.state, flag.closed_by) == (IdleState.RELEASED, operator)
    assert PoolRequest.objects.get(pk=allocation.pool.request_id).state == "released"
    assert len(callbacks) == 2  # the pools app's Kubernetes clean-up, then the queue gets the units
    assert release_idle(flag.pk, actor=operator) is False  # already done


def test_release_of_one_unit_keeps_the_pool_and_reconciles_the_quota(
    fleet, project, operator, django_capture_on_commit_callbacks
):
    first = allocate(project, fleet.mig_3g)
    second = allocate(project, fleet.mig_2g, pool=first.pool)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert release_allocation(second.pk, at=NOW) is True
    second.refresh_from_db()
    first.refresh_from_db()
    assert (second.released_at, first.released_at) == (NOW, None)
    assert len(callbacks) == 2  # the quota's reconcile, then the queue gets the unit
    assert release_allocation(second.pk, at=NOW) is False


def test_dismissed_flags_close_without_touching_the_allocation(fleet, project, operator, coverage_per_5_minutes):
    allocation = allocate(project, fleet.mig_3g)
    fill(series_of(fleet.mig_gpu, fleet.mig_3g), sm=1.0)
    detect_idle(now=NOW)
    assert dismiss(list(IdleReservation.objects.values_list("pk", flat=True)), actor=operator) == 1
    allocation.refresh_from_db()
    assert allocation.released_at is None
    assert IdleReservation.objects.get().state == IdleState.DISMISSED


def test_activity_of_a_trespasser_is_not_the_owners(fleet, project, other_project, coverage_per_5_minutes):
    """The unit was busy all day, but with another project's pod: for its owner the reservation is idle."""
    from monitoring.models import TrespassEvent

    allocation = allocate(project, fleet.mig_3g)
    fill(series_of(fleet.mig_gpu, fleet.mig_3g), sm=80.0)
    TrespassEvent.objects.create(
        kind="foreign_pod",
        gpu=fleet.mig_gpu,
        mig_instance=fleet.mig_3g,
        unit_key=f"mig:{fleet.mig_3g.pk}",
        owner_project=project,
        project=other_project,
        started_at=NOW - timedelta(days=2),
    )
    assert detect_idle(now=NOW)["flagged"] == 1
    assert IdleReservation.objects.get().allocation == allocation
