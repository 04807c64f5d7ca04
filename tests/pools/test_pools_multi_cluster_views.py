"""A pool across clusters is shown as one pool with its units per cluster: the project view's card, the
monitoring API, the admin's cluster filter, and the Prometheus pool metrics (one series per cluster)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from monitoring.adapters.prometheus import parse
from monitoring.models import HealthEvent, IdleReservation
from monitoring.services.ingest import ingest_samples, sample_row, series_ids
from pools import services
from pools.choices import PoolClusterState
from pools.models import Allocation, PoolCluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def six(fleet, make_request, operator):
    """6 x 3g.40gb across c1 (4 units, the home cluster) and c2 (2), approved as one pool."""
    fleet.mig_node("a1", [["3g.40gb", "3g.40gb"]] * 2, cluster="c1")
    fleet.mig_node("b1", [["3g.40gb", "3g.40gb"]], cluster="c2")
    fleet.cluster("c3")  # a cluster the pool has nothing on
    return services.approve(make_request(count=6, allow_multi_cluster=True, name="span"), actor=operator)


def parts(pool) -> dict[str, PoolCluster]:
    return {p.cluster.name: p for p in pool.pool_clusters.select_related("cluster")}


def test_a_cluster_part_follows_its_provisioning_and_clean_up(six):
    c1, c2 = parts(six)["c1"], parts(six)["c2"]
    assert (c1.state, c2.state) == (PoolClusterState.PROVISIONING, PoolClusterState.PROVISIONING)
    now = timezone.now()
    PoolCluster.objects.filter(pk=c1.pk).update(provisioned_at=now)
    PoolCluster.objects.filter(pk=c2.pk).update(error="Kubernetes (c2): 500")
    assert [parts(six)[n].state for n in ("c1", "c2")] == [PoolClusterState.PROVISIONED, PoolClusterState.FAILED]
    type(six).objects.filter(pk=six.pk).update(released_at=now)
    PoolCluster.objects.filter(pk=c2.pk).update(error="")
    six.refresh_from_db()
    PoolCluster.objects.filter(pk=c1.pk).update(deprovisioned_at=now)
    assert [parts(six)[n].state for n in ("c1", "c2")] == [PoolClusterState.CLEANED_UP, PoolClusterState.CLEANING_UP]


def test_the_project_view_shows_the_pool_once_with_units_and_provisioning_per_cluster(six, client, bob):
    PoolCluster.objects.filter(pool=six, cluster__name="c1").update(provisioned_at=timezone.now())
    PoolCluster.objects.filter(pool=six, cluster__name="c2").update(error="Kubernetes (c2): quota refused")
    client.force_login(bob)
    page = client.get("/projects/team-a/")
    assert page.status_code == 200
    (card,) = page.context["pools"]
    assert (card["id"], card["cluster"], card["profiles_total"], card["units_per_cluster"]) == (
        six.pk,
        "c1",
        6,
        "c1 4, c2 2",
    )
    assert [(c["name"], c["units"], c["state"], c["error"]) for c in card["clusters"]] == [
        ("c1", 4, "provisioned", ""),
        ("c2", 2, "failed", "Kubernetes (c2): quota refused"),
    ]
    html = page.content.decode()
    assert "team-a · H100-80GB 3g.40gb x 6: c1 4, c2 2 · Inference" in html
    assert html.count(f'id="gd-pool-{six.pk}"') == 1  # one card, not one per cluster
    assert 'data-cluster="c1">c1: 4 units, <span class="gd-badge gd-badge-ok">Provisioned</span>' in html
    assert 'data-cluster="c2">c2: 2 units, <span class="gd-badge gd-badge-error"' in html

    detail = client.get(reverse("projects:pool", args=["team-a", six.pk]))
    assert detail.context["card"]["units_per_cluster"] == "c1 4, c2 2"
    assert sorted({u["cluster"] for u in detail.context["allocation"]["units"]}) == ["c1", "c2"]
    assert "c1 4, c2 2" in detail.content.decode()


def test_a_pool_on_one_cluster_keeps_its_one_line_card(fleet, make_request, operator, client, bob):
    fleet.mig_node("a1", [["3g.40gb", "3g.40gb"]], cluster="c1")
    pool = services.approve(make_request(count=2), actor=operator)
    client.force_login(bob)
    page = client.get("/projects/team-a/")
    (card,) = page.context["pools"]
    assert [(c["name"], c["units"]) for c in card["clusters"]] == [("c1", 2)]
    html = page.content.decode()
    assert "team-a · c1 · H100-80GB 3g.40gb · Inference" in html
    assert "data-cluster-states" not in html
    assert card["id"] == pool.pk


def test_the_monitoring_api_gives_the_units_per_cluster_and_lists_the_pool_under_each(six, fleet, api, bob):
    c1, c2, c3 = (fleet.clusters[n] for n in ("c1", "c2", "c3"))
    listed = api(bob).get("/api/v1/monitoring/pools/")
    assert listed.status_code == 200
    (row,) = listed.data["results"]
    assert (row["pool"], row["cluster"], row["units"]) == (six.pk, "c1", 6)
    assert [(c["cluster_name"], c["units"], c["state"]) for c in row["clusters"]] == [
        ("c1", 4, "provisioning"),
        ("c2", 2, "provisioning"),
    ]
    for cluster, expected in ((c1, [six.pk]), (c2, [six.pk]), (c3, [])):
        got = api(bob).get("/api/v1/monitoring/pools/", {"cluster": cluster.pk}).data["results"]
        assert [r["pool"] for r in got] == expected


def test_the_admin_lists_the_pool_under_each_of_its_clusters(six, fleet, client, operator):
    client.force_login(operator)
    url = reverse("admin:pools_gpupool_changelist")
    for name, shown in (("c1", True), ("c2", True), ("c3", False)):
        page = client.get(url, {"cluster": fleet.clusters[name].pk})
        assert page.status_code == 200
        assert [p.pk for p in page.context["cl"].result_list] == ([six.pk] if shown else [])
    detail = client.get(reverse("admin:pools_gpupool_change", args=[six.pk]))
    inline = next(f for f in detail.context["inline_admin_formsets"] if f.opts.model is PoolCluster)
    assert [(form.original.cluster.name, form.original.state.label) for form in inline] == [
        ("c1", "Provisioning"),
        ("c2", "Provisioning"),
    ]


def metrics(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    assert "# TYPE gpuaas_pool_sm_measured_slices gauge" in text
    return {(s.name, s.labels["cluster"]): s.value for s in parse(text) if s.labels.get("pool") == "span"}


def test_prometheus_pool_metrics_carry_the_cluster_of_the_units(six, client, operator):
    on = {
        name: list(Allocation.objects.filter(pool=six, gpu__node__cluster__name=name).order_by("pk"))
        for name in ("c1", "c2")
    }
    now = timezone.now()
    ids = series_ids([(a.gpu_id, a.mig_instance_id) for units in on.values() for a in units])
    rows = [
        sample_row(ids[(a.gpu_id, a.mig_instance_id)], now - timedelta(minutes=2), {"sm_active": sm})
        for name, sm in (("c1", 80.0), ("c2", 20.0))
        for a in on[name]
    ]
    ingest_samples(rows)
    HealthEvent.objects.create(gpu=on["c2"][0].gpu, rule="ecc_dbe", level="critical")
    IdleReservation.objects.create(
        allocation=on["c2"][1], window_start=now, window_end=now, sm_active_avg=1.0, coverage=1.0, proposal="release"
    )
    client.force_login(operator)

    got = metrics(client)

    assert got == {
        ("gpuaas_pool_units", "c1"): 4.0,
        ("gpuaas_pool_units", "c2"): 2.0,
        ("gpuaas_pool_sm_active_avg", "c1"): 80.0,
        ("gpuaas_pool_sm_active_avg", "c2"): 20.0,
        ("gpuaas_pool_sm_measured_slices", "c1"): 12.0,  # 4 x 3g.40gb, 3 compute slices each
        ("gpuaas_pool_sm_measured_slices", "c2"): 6.0,
        ("gpuaas_pool_health_events_open", "c1"): 0.0,
        ("gpuaas_pool_health_events_open", "c2"): 1.0,  # on a GPU holding 2 of its units: one event
        ("gpuaas_pool_idle_reservations_open", "c1"): 0.0,
        ("gpuaas_pool_idle_reservations_open", "c2"): 1.0,
    }
    # The pool's totals, as PromQL's sum by (project, pool) would give them.
    assert got[("gpuaas_pool_units", "c1")] + got[("gpuaas_pool_units", "c2")] == six.request.count
    slices = {c: got[("gpuaas_pool_sm_measured_slices", c)] for c in ("c1", "c2")}
    pool_sm = sum(got[("gpuaas_pool_sm_active_avg", c)] * slices[c] for c in slices) / sum(slices.values())
    assert pool_sm == pytest.approx((80.0 * 12 + 20.0 * 6) / 18)


def test_prometheus_keeps_a_series_on_a_cluster_whose_units_are_gone(six, client, operator):
    """A cluster the pool holds no unit on any more (an instance destroyed) keeps its series, at 0."""
    Allocation.objects.filter(pool=six, gpu__node__cluster__name="c2").update(released_at=timezone.now())
    client.force_login(operator)
    got = metrics(client)
    assert (got[("gpuaas_pool_units", "c1")], got[("gpuaas_pool_units", "c2")]) == (4.0, 0.0)
    assert ("gpuaas_pool_units", "c3") not in got
