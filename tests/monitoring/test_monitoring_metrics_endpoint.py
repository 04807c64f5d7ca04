"""/metrics: Prometheus text with pool, project and health gauges; bearer token or staff only."""

from datetime import timedelta

import pytest
from django.utils import timezone
from monitoring_helpers import allocate, series_of, write
from prometheus_client.parser import text_string_to_metric_families

from monitoring.models import HealthEvent, IdleReservation

pytestmark = pytest.mark.django_db


def samples(body: bytes) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


@pytest.fixture
def busy(fleet, project):
    now = timezone.now()
    allocation = allocate(project, fleet.mig_3g, at=now - timedelta(days=1))
    allocate(project, fleet.mig_1g, at=now - timedelta(days=1), pool=allocation.pool)
    write(series_of(fleet.mig_gpu, fleet.mig_3g), now - timedelta(minutes=2), sm_active=90.0)
    write(series_of(fleet.mig_gpu, fleet.mig_1g), now - timedelta(minutes=2), sm_active=20.0)
    HealthEvent.objects.create(gpu=fleet.mig_gpu, rule="ecc_dbe", level="critical")
    IdleReservation.objects.create(
        allocation=allocation, window_start=now, window_end=now, sm_active_avg=1.0, coverage=1.0, proposal="release"
    )
    return allocation.pool


def test_metrics_render_pool_and_health_gauges(client, operator, busy):
    client.force_login(operator)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    got = samples(response.content)
    pool = (("cluster", "c1"), ("pool", busy.name), ("project", "team-a"))
    assert got[("gpuaas_pool_units", pool)] == 2.0
    assert got[("gpuaas_pool_sm_active_avg", pool)] == pytest.approx((90.0 * 3 + 20.0 * 1) / 4)
    assert got[("gpuaas_pool_health_events_open", pool)] == 1.0
    assert got[("gpuaas_pool_idle_reservations_open", pool)] == 1.0
    assert got[("gpuaas_gpu_health_events_open", (("cluster", "c1"), ("level", "critical"), ("rule", "ecc_dbe")))] == 1
    assert got[("gpuaas_gpus", (("cluster", "c1"), ("health", "ok")))] == 2.0


def test_bearer_token_when_configured(client, settings, busy):
    settings.MONITORING_METRICS_TOKEN = "s3cret-scrape-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").status_code == 200


@pytest.mark.parametrize("debug", [False, True])
def test_no_token_means_staff_only_even_in_debug(client, settings, bob, operator, busy, debug):
    settings.MONITORING_METRICS_TOKEN = ""
    settings.DEBUG = debug
    assert client.get("/metrics").status_code == 401
    client.force_login(bob)
    assert client.get("/metrics").status_code == 401
    client.force_login(operator)
    assert client.get("/metrics").status_code == 200


def test_token_configured_still_admits_staff_session_but_not_a_wrong_bearer(client, settings, operator, busy):
    settings.MONITORING_METRICS_TOKEN = "s3cret-scrape-token"
    settings.DEBUG = True
    assert client.get("/metrics").status_code == 401
    client.force_login(operator)
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_staff_without_the_permission_get_401_and_operators_get_the_metrics(
    client, settings, staff_nobody, staff_operator, busy
):
    settings.MONITORING_METRICS_TOKEN = ""
    settings.DEBUG = False
    client.force_login(staff_nobody)
    assert client.get("/metrics").status_code == 401
    client.force_login(staff_operator)
    assert client.get("/metrics").status_code == 200
