"""The operator dashboard's JSON: cluster cards, profile distribution, approvals, health, idle, costs, trends."""

import pytest
from dashboard_world import add_signals
from django.urls import reverse

pytestmark = pytest.mark.django_db

URL = "/admin/dashboard/data.json"


@pytest.fixture
def data(client, operator, world):
    add_signals(world)
    client.force_login(operator)
    response = client.get(URL)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert "no-store" in response["Cache-Control"]
    return response.json()


def test_dashboard_cluster_cards_compare_clusters(data, world):
    alpha, beta = data["clusters"]
    assert data["totals"] == {"clusters": 2, "nodes": 4, "gpus": 5, "mig_instances": 6}
    assert (alpha["name"], beta["name"]) == ("alpha", "beta")
    # Gone node a3 and the lost GPU on a2 are not counted.
    assert {k: alpha[k] for k in ("nodes", "nodes_schedulable", "gpus", "gpus_mig_enabled", "mig_instances")} == {
        "nodes": 2,
        "nodes_schedulable": 2,
        "gpus": 3,
        "gpus_mig_enabled": 2,
        "mig_instances": 4,
    }
    assert alpha["units"] == {
        "in_use": 2, "ready": 2, "available": 1, "tier_policy": 0, "unavailable": 0, "total": 5
    }  # fmt: skip
    # Allocated, by each unit's share of its GPU (capacity.mig.share, as billing charges it): two
    # 3g.40gb (4 of 8 memory slices: 1/2 each), a 1g.10gb (1/7 compute) and one whole GPU = 15/7 of 3.
    # In use: a 3g.40gb and the 1g.10gb = 9/14.
    assert alpha["gpu_equivalents"] == {"total": 3, "allocated": 2.1429, "free": 0.8571, "in_use": 0.6429}
    assert (alpha["allocated_pct"], alpha["in_use_pct"]) == (71.4, 21.4)
    assert beta["units"] == {
        "in_use": 0, "ready": 0, "available": 3, "tier_policy": 0, "unavailable": 0, "total": 3
    }  # fmt: skip
    assert beta["gpu_equivalents"] == {"total": 2, "allocated": 0.0, "free": 2.0, "in_use": 0.0}
    assert alpha["url"] == reverse("admin:gpuaas_dashboard_cluster", args=[world.alpha.pk])


def test_dashboard_health_counters_count_gpus_with_open_events(data):
    alpha, beta = data["clusters"]
    # a1 GPU 1 critical XID -> Error; a2 GPU 0 thermal throttling -> Throttling; the resolved event is gone.
    assert alpha["health"] == {"error": 1, "throttling": 1, "caution": 0}
    assert beta["health"] == {"error": 0, "throttling": 0, "caution": 1}


def test_dashboard_cluster_activity_is_the_latest_five_minutes(data):
    alpha, beta = data["clusters"]
    assert (alpha["activity"]["sm_active_pct"], alpha["activity"]["power_w"]) == (40.0, 900.0)
    assert (beta["activity"]["sm_active_pct"], beta["activity"]["power_w"]) == (40.0, 600.0)


def test_dashboard_profile_distribution_by_status(data):
    rows = {row["shape"]: (row["in_use"], row["ready"], row["available"], row["total"]) for row in data["profiles"]}
    assert [row["label"] for row in data["profiles"]] == ["1g", "2g", "3g", "4g", "7g", "Full"]
    assert rows == {
        "1g": (1, 0, 0, 1),
        "2g": (0, 0, 3, 3),  # H100 2g.20gb and two A30 2g.12gb
        "3g": (1, 1, 0, 2),
        "4g": (0, 0, 0, 0),
        "7g": (0, 0, 0, 0),
        "full": (0, 1, 1, 2),
    }


def test_dashboard_pending_approvals_post_the_admin_actions(data, world):
    pending = data["pending"]
    assert pending["count"] == 1
    assert [(i["id"], i["project"], i["spec"], i["count"]) for i in pending["items"]] == [
        (world.pending.pk, "team-a", "H100-80GB 2g.20gb", 1)
    ]
    assert pending["action_url"] == reverse("admin:pools_poolrequest_changelist")
    assert [a["name"] for a in pending["actions"]] == ["approve_selected", "reject_selected"]


def test_dashboard_health_events_idle_reservations_and_costs(data):
    events = data["health_events"]
    assert events["available"] is True
    assert [(e["rule"], e["where"]) for e in events["items"]] == [
        ("XID error (application or recoverable)", "beta/b1 GPU 0"),
        ("Thermal clock throttling", "alpha/a2 GPU 0"),
        ("Critical XID error", "alpha/a1 GPU 1"),
    ]
    idle = data["idle_reservations"]
    assert [(i["project"], i["pool"], i["unit"], i["proposal"]) for i in idle["items"]] == [
        ("team-a", "inference", "H100-80GB 3g.40gb on alpha/a1 GPU 0", "Release")
    ]
    costs = data["costs"]
    assert (costs["currency"], costs["total"]) == ("EUR", "3.48")
    assert costs["items"] == [
        {"id": costs["items"][0]["id"], "project": "team-a", "hours": "3.0", "reserved": "3.75", "credits": "-0.63",
         "total": "3.12", "used": "1.25"},
        {"id": costs["items"][1]["id"], "project": "team-b", "hours": "1.0", "reserved": "0.36", "credits": "0.00",
         "total": "0.36", "used": None},
    ]  # fmt: skip


def test_dashboard_trends_per_cluster(data):
    series = data["series"]
    assert series["available"] is True
    assert [m["key"] for m in series["metrics"]] == ["sm_active_pct", "power_w", "gpu_util_pct"]
    alpha, beta = series["series"]
    assert (alpha["label"], len(alpha["points"])) == ("alpha", 12)
    assert {k: alpha["points"][-1][k] for k in ("power_w", "sm_active_pct", "gpu_util_pct")} == {
        "power_w": 900.0,
        "sm_active_pct": 40.0,
        "gpu_util_pct": 55.0,
    }
    assert beta["points"][-1]["power_w"] == 600.0


def test_dashboard_without_metrics_says_so(client, operator, world):
    client.force_login(operator)
    data = client.get(URL).json()
    assert data["series"] == {"available": False, "reason": "No metrics recorded in the last 3 hours yet."}
    assert data["clusters"][0]["activity"] is None
    assert data["costs"]["items"] == []
    assert data["health_events"]["items"] == []


def test_dashboard_page_embeds_its_data_and_endpoint(client, operator, world):
    client.force_login(operator)
    page = client.get("/admin/dashboard/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'data-source="/admin/dashboard/data.json"' in html and 'data-refresh="15"' in html
    assert '<script id="gd-data" type="application/json">' in html
    assert "/static/gpuaas/vendor/chartjs/chart.umd.min.js" in html
    assert 'href="/admin/dashboard/"' in client.get("/admin/").content.decode()
