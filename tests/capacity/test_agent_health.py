"""Each node's agent on the cluster page and in the API: version, last report, health (ok / stale / never)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from capacity.agent import protocol
from capacity.models import Cluster, NodeCapacity
from capacity.services.discovery import discover_cluster

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


@pytest.fixture
def nodes(db):
    cluster = Cluster.objects.create(name="edge", kubeconfig_path="/nonexistent")
    now = timezone.now()
    never = NodeCapacity.objects.create(cluster=cluster, name="n-never", gpu_count=1)
    stale = NodeCapacity.objects.create(
        cluster=cluster,
        name="n-stale",
        gpu_count=1,
        agent_version="0.0.9",
        agent_reported_at=now - timedelta(seconds=settings.AGENT_STALE_AFTER_S + 1),
    )
    ok = NodeCapacity.objects.create(
        cluster=cluster, name="n-ok", gpu_count=1, agent_version="0.1.0", agent_reported_at=now
    )
    return cluster, never, stale, ok


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_health_is_never_stale_or_ok(nodes):
    _, never, stale, ok = nodes
    assert (never.agent_health(), stale.agent_health(), ok.agent_health()) == ("never", "stale", "ok")


def test_api_node_and_cluster_detail_show_each_agent(nodes, operator):
    cluster, never, _, _ = nodes
    client = api(operator)
    node = client.get(f"/api/v1/capacity/nodes/{never.pk}/").json()
    assert (node["agent_version"], node["agent_reported_at"], node["agent_health"]) == ("", None, "never")
    detail = client.get(f"/api/v1/capacity/clusters/{cluster.pk}/").json()
    assert [(a["name"], a["agent_version"], a["agent_health"]) for a in detail["agents"]] == [
        ("n-never", "", "never"),
        ("n-ok", "0.1.0", "ok"),
        ("n-stale", "0.0.9", "stale"),
    ]
    assert detail["last_onboarding"] is None
    assert "agents" not in client.get("/api/v1/capacity/clusters/").json()["results"][0]


def test_cluster_page_shows_a_node_whose_agent_never_reported(nodes, client, staff_operator):
    cluster = nodes[0]
    client.force_login(staff_operator)
    page = client.get(f"/admin/capacity/cluster/{cluster.pk}/change/").content.decode()
    assert "<tr><td>n-never</td><td>—</td><td>never</td><td><strong>Never reported</strong></td></tr>" in page
    assert "<td>n-stale</td><td>0.0.9</td>" in page and "<strong>Stale</strong>" in page
    assert "never onboarded" in page


def test_agent_reports_stamp_version_and_time(simcluster):
    sim = simcluster("demo")
    cluster = sim.register("prod")["prod"]
    assert discover_cluster(cluster.pk, inventory="inline").run.status == "succeeded"
    node = NodeCapacity.objects.for_cluster(cluster).present().filter(gpu_count__gt=0).first()
    assert node.agent_version == settings.GPUAAS_VERSION
    assert node.agent_health() == "ok"

    from monitoring.services.reports import poll_node

    NodeCapacity.objects.filter(pk=node.pk).update(agent_reported_at=None, agent_version="")
    poll_node(node.pk)
    node.refresh_from_db()
    assert (node.agent_version, node.agent_health()) == (settings.GPUAAS_VERSION, "ok")


def test_a_report_from_an_agent_older_than_the_version_field_is_still_read():
    body = protocol.metrics_body([], error="", elapsed_ms=1)
    assert body["agent"] == settings.GPUAAS_VERSION
    del body["agent"]
    assert protocol.metrics_from_body(body) == ([], "", 1)
    assert protocol.reported_version(body) == ""
