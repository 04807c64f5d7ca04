"""Operator console: health events (filters, resolve), idle flags (release in one step), series (latest + chart)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from monitoring_helpers import allocate, series_of, write

from monitoring.choices import IdleState
from monitoring.models import HealthEvent, IdleReservation

pytestmark = pytest.mark.django_db


def test_resolve_action_resolves_and_reports(client, operator, fleet):
    event = HealthEvent.objects.create(gpu=fleet.full_gpu, rule="ecc_dbe", level="critical")
    client.force_login(operator)
    listing = client.get("/admin/monitoring/healthevent/", {"status": "open", "level": "critical"})
    assert listing.status_code == 200 and "ECC double-bit" in listing.content.decode()
    response = client.post(
        "/admin/monitoring/healthevent/",
        {"action": "resolve_selected", "_selected_action": [event.pk]},
        follow=True,
    )
    assert "1 event(s) resolved." in response.content.decode()
    event.refresh_from_db()
    assert (event.resolved_by, event.resolution) == (operator, "resolved by an operator")


def test_release_action_releases_the_flagged_allocation(client, operator, fleet, project):
    from pools.models import Allocation, PoolRequest

    allocation = allocate(project, fleet.mig_3g)
    PoolRequest.objects.filter(pk=allocation.pool.request_id).update(state="active")
    now = timezone.now()
    flag = IdleReservation.objects.create(
        allocation=allocation,
        window_start=now - timedelta(days=1),
        window_end=now,
        sm_active_avg=0.8,
        coverage=1.0,
        proposal="release",
    )
    client.force_login(operator)
    response = client.post(
        "/admin/monitoring/idlereservation/",
        {"action": "release_selected", "_selected_action": [flag.pk]},
        follow=True,
    )
    assert "1 allocation(s) released." in response.content.decode()
    assert Allocation.objects.get(pk=allocation.pk).released_at is not None
    flag.refresh_from_db()
    assert flag.state == IdleState.RELEASED


def test_series_pages_show_latest_values_and_a_24h_sparkline(client, operator, fleet):
    sid = series_of(fleet.mig_gpu, fleet.mig_3g)
    now = timezone.now()
    for minutes in (30, 20, 10, 1):
        write(sid, now - timedelta(minutes=minutes), sm_active=80.0 + minutes / 10, mem_used_mib=20000)
    client.force_login(operator)
    listing = client.get("/admin/monitoring/series/").content.decode()
    assert "80.1 %" in listing  # the newest sample's SM activity
    page = client.get(f"/admin/monitoring/series/{sid}/change/").content.decode()
    assert page.count('<svg class="sparkline"') == 2 and "<polyline" in page  # SM activity and memory
    assert "no data" in page  # power: not available on a MIG instance
    assert "ECC double-bit (volatile / aggregate)" in page and "– / –" in page
