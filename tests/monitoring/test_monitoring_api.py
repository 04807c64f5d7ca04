"""Monitoring API: members read their own partitions only (another project's series is a 404), points are
limited to their allocation windows, operators read everything; pool summaries, health events, idle flags."""

from datetime import timedelta

import pytest
from monitoring_helpers import T0, allocate, series_of, write
from rest_framework.test import APIClient

from monitoring.choices import IdleProposal
from monitoring.models import HealthEvent, IdleReservation

pytestmark = pytest.mark.django_db

HANDOVER = T0 + timedelta(minutes=2)


@pytest.fixture
def world(fleet, project, other_project):
    """team-a holds the 3g instance; team-b the 1g instance; the full GPU passed from team-a to team-b."""
    a_mig = allocate(project, fleet.mig_3g)
    b_mig = allocate(other_project, fleet.mig_1g)
    a_full = allocate(project, fleet.full_gpu, released_at=HANDOVER)
    b_full = allocate(other_project, fleet.full_gpu, at=HANDOVER)
    ids = {
        "3g": series_of(fleet.mig_gpu, fleet.mig_3g),
        "2g": series_of(fleet.mig_gpu, fleet.mig_2g),
        "1g": series_of(fleet.mig_gpu, fleet.mig_1g),
        "parent": series_of(fleet.mig_gpu),
        "full": series_of(fleet.full_gpu),
    }
    for i in range(8):  # 10:00:00 .. 10:03:30 every 30 s
        ts = T0 + timedelta(seconds=30 * i)
        write(ids["3g"], ts, sm_active=95.0, mem_used_mib=30000)
        write(ids["1g"], ts, sm_active=25.0, mem_used_mib=5000)
        write(ids["full"], ts, sm_active=float(i), power_w=300.0)
    return {"ids": ids, "a_mig": a_mig, "b_mig": b_mig, "a_full": a_full, "b_full": b_full}


def client_for(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


RANGE = {"start": T0.isoformat(), "end": (T0 + timedelta(minutes=10)).isoformat(), "step": "raw"}


def test_members_list_only_the_series_of_their_partitions(world, bob, charlie, operator):
    ids = world["ids"]
    listed = {
        u: {r["id"] for r in client_for(u).get("/api/v1/monitoring/series/").json()["results"]}
        for u in (bob, charlie, operator)
    }
    assert listed[bob] == {ids["3g"], ids["full"]}
    assert listed[charlie] == {ids["1g"], ids["full"]}
    assert listed[operator] == set(ids.values())


def test_another_projects_series_is_not_found(world, charlie):
    client = client_for(charlie)
    assert client.get(f"/api/v1/monitoring/series/{world['ids']['3g']}/").status_code == 404
    assert client.get(f"/api/v1/monitoring/series/{world['ids']['3g']}/samples/", RANGE).status_code == 404
    assert client.get(f"/api/v1/monitoring/series/{world['ids']['parent']}/").status_code == 404


def test_samples_of_own_partition(world, bob):
    response = client_for(bob).get(f"/api/v1/monitoring/series/{world['ids']['3g']}/samples/", RANGE)
    assert response.status_code == 200
    body = response.json()
    assert (body["step"], body["aggregate"], len(body["points"])) == ("raw", "raw", 8)
    assert body["points"][0] == {
        "ts": "2026-03-02T10:00:00Z",
        "power_w": None,
        "sm_active": 95.0,
        "gpu_util": None,
        "mem_used_mib": 30000,
        "temp_c": None,
    }


def test_a_shared_history_shows_each_holder_only_their_own_window(world, bob, charlie, operator):
    url = f"/api/v1/monitoring/series/{world['ids']['full']}/samples/"
    params = {**RANGE, "metrics": ["sm_active"]}
    before = [p["sm_active"] for p in client_for(bob).get(url, params).json()["points"]]
    after = [p["sm_active"] for p in client_for(charlie).get(url, params).json()["points"]]
    everything = [p["sm_active"] for p in client_for(operator).get(url, params).json()["points"]]
    assert (before, after, everything) == ([0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [float(i) for i in range(8)])


def test_five_minute_steps_aggregate_on_the_fly(world, bob):
    params = {**RANGE, "step": "5m", "aggregate": "max", "metrics": ["sm_active", "mem_used_mib"]}
    body = client_for(bob).get(f"/api/v1/monitoring/series/{world['ids']['3g']}/samples/", params).json()
    assert body["points"] == [{"ts": "2026-03-02T10:00:00Z", "sm_active": 95.0, "mem_used_mib": 30000}]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "2026-03-02T11:00:00Z", "end": "2026-03-02T10:00:00Z"}, "start"),
        ({"step": "10s"}, "step"),
        ({"step": "raw", "start": "2026-02-01T00:00:00Z", "end": "2026-03-01T00:00:00Z"}, "step"),
        ({"aggregate": "median"}, "aggregate"),
        ({"metrics": "voltage"}, "metrics"),
        ({"start": "yesterday"}, "start"),
    ],
)
def test_bad_queries_are_400_with_the_field(world, bob, params, field):
    response = client_for(bob).get(f"/api/v1/monitoring/series/{world['ids']['3g']}/samples/", params)
    assert response.status_code == 400
    assert field in response.json()


def test_pool_utilisation_is_slice_weighted_and_scoped(world, bob, charlie):
    pool = world["a_mig"].pool
    url = f"/api/v1/monitoring/pools/{pool.pk}/"
    params = {"start": T0.isoformat(), "end": (T0 + timedelta(minutes=5)).isoformat(), "step": "5m"}
    body = client_for(bob).get(url, params).json()
    assert (body["units"], body["measured_units"], body["sm_active_avg"]) == (1, 1, 95.0)
    assert body["points"] == [{"ts": "2026-03-02T10:00:00Z", "sm_active": 95.0, "units": 1}]
    assert client_for(charlie).get(url, params).status_code == 404
    listed = client_for(bob).get("/api/v1/monitoring/pools/", params).json()["results"]
    assert sorted(r["pool"] for r in listed) == sorted([world["a_mig"].pool_id, world["a_full"].pool_id])


def test_health_events_reach_the_projects_holding_the_unit(world, fleet, bob, charlie, operator):
    gpu_level = HealthEvent.objects.create(
        gpu=fleet.mig_gpu, rule="ecc_dbe", level="critical", opened_at=T0, last_seen_at=T0
    )
    mig_level = HealthEvent.objects.create(
        gpu=fleet.mig_gpu, mig_instance=fleet.mig_1g, rule="xid_warning", level="warning", opened_at=T0, last_seen_at=T0
    )
    after_handover = HealthEvent.objects.create(
        gpu=fleet.full_gpu,
        rule="thermal_throttle",
        level="warning",
        opened_at=HANDOVER + timedelta(hours=1),
        last_seen_at=HANDOVER + timedelta(hours=1),
    )

    def seen(user):
        return {r["id"] for r in client_for(user).get("/api/v1/monitoring/health-events/").json()["results"]}

    assert seen(bob) == {gpu_level.pk}
    assert seen(charlie) == {gpu_level.pk, mig_level.pk, after_handover.pk}
    assert seen(operator) == {gpu_level.pk, mig_level.pk, after_handover.pk}
    assert client_for(bob).get(f"/api/v1/monitoring/health-events/{mig_level.pk}/").status_code == 404
    critical = client_for(charlie).get("/api/v1/monitoring/health-events/", {"level": "critical", "open": "true"})
    assert [r["id"] for r in critical.json()["results"]] == [gpu_level.pk]


def test_idle_flags_are_scoped_to_the_project(world, bob, charlie):
    flag = IdleReservation.objects.create(
        allocation=world["a_mig"],
        window_start=T0 - timedelta(days=1),
        window_end=T0,
        sm_active_avg=1.5,
        coverage=1.0,
        proposal=IdleProposal.RELEASE,
    )
    assert [r["id"] for r in client_for(bob).get("/api/v1/monitoring/idle-reservations/").json()["results"]] == [
        flag.pk
    ]
    assert client_for(charlie).get("/api/v1/monitoring/idle-reservations/").json()["results"] == []
    assert client_for(charlie).get(f"/api/v1/monitoring/idle-reservations/{flag.pk}/").status_code == 404


def test_anonymous_callers_are_refused(world):
    assert APIClient().get("/api/v1/monitoring/series/").status_code in (401, 403)


@pytest.mark.parametrize("url", ["/api/v1/monitoring/series/", "/api/v1/monitoring/health-events/"])
def test_list_queries_do_not_grow_with_rows(world, fleet, bob, url):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def count():
        with CaptureQueriesContext(connection) as queries:
            assert client_for(bob).get(url).status_code == 200
        return len(queries)

    HealthEvent.objects.create(gpu=fleet.mig_gpu, rule="ecc_dbe", level="critical", opened_at=T0, last_seen_at=T0)
    few = count()
    for rule in ("thermal_throttle", "power_throttle", "remap_pending"):
        HealthEvent.objects.create(gpu=fleet.mig_gpu, rule=rule, level="warning", opened_at=T0, last_seen_at=T0)
    allocate(bob_project(bob), fleet.mig_2g)
    series_of(fleet.mig_gpu, fleet.mig_2g)
    assert count() == few


def bob_project(user):
    from tenancy.roles import projects_for

    return projects_for(user).get()
