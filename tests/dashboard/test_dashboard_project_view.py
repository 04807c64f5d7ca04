"""The project view: pool cards, the allocation tab, the monitoring tab's series and the project's costs."""

import datetime as dt

import pytest
from dashboard_world import add_signals
from django.utils import timezone

pytestmark = pytest.mark.django_db


def test_pool_cards_show_the_seed_fields(client, world, bob):
    client.force_login(bob)
    cards = {c["name"]: c for c in client.get("/projects/").context["pools"]}
    inference = cards["inference"]
    keys = (
        "total_gpus",
        "in_use_gpus",
        "gpus_touched",
        "gpus_touched_in_use",
        "profiles_in_use",
        "profiles_total",
        "tags",
    )
    # Two 3g.40gb of one H100, one of them in use: each is half the GPU (4 of 8 memory slices).
    assert {k: inference[k] for k in keys} == {
        "total_gpus": 1.0,
        "in_use_gpus": 0.5,
        "gpus_touched": 1,
        "gpus_touched_in_use": 1,
        "profiles_in_use": 1,
        "profiles_total": 2,
        "tags": ["3g.40gb", "sla"],
    }
    assert (inference["project"], inference["cluster"], inference["state"]) == ("team-a", "alpha", "active")
    assert inference["created"] == world.pools["inference"].created_at.date().isoformat()
    training = cards["training"]
    assert (training["total_gpus"], training["in_use_gpus"], training["allocation"]) == (1, 0, "0/1")


def test_project_profile_distribution_counts_held_units(client, world, bob):
    client.force_login(bob)
    rows = {r["shape"]: (r["in_use"], r["ready"]) for r in client.get("/projects/team-a/").context["profiles"]}
    assert rows == {"1g": (0, 0), "2g": (0, 0), "3g": (1, 1), "4g": (0, 0), "7g": (0, 0), "full": (0, 1)}


def test_allocation_tab_lists_units_by_node(client, world, bob):
    client.force_login(bob)
    page = client.get(f"/projects/team-a/pools/{world.pools['inference'].pk}/")
    allocation = page.context["allocation"]
    assert [(u["node"], u["gpu_index"], u["profile"], u["placement"], u["status"]) for u in allocation["units"]] == [
        ("a1", 0, "3g.40gb", "0:4", "in_use"),
        ("a1", 0, "3g.40gb", "4:4", "ready"),
    ]
    assert (allocation["in_use"], allocation["ready"]) == (1, 1)
    assert allocation["nodes"] == [
        {"node": "alpha/a1", "shapes": [{"shape": "3g", "label": "3g", "in_use": 1, "ready": 1}]}
    ]
    html = page.content.decode()
    assert 'role="tab"' in html and 'aria-selected="true"' in html and 'aria-controls="gd-panel-monitoring"' in html


def test_the_pool_page_tells_when_an_ended_units_pods_are_evicted(client, world, bob, settings):
    from pools.models import Allocation

    settings.ALLOCATION_ENDING_GRACE_S = 300
    pool = world.pools["inference"]
    ended = Allocation.objects.filter(pool=pool).order_by("pk").first()
    at = timezone.now().replace(microsecond=0)
    Allocation.objects.filter(pk=ended.pk).update(released_at=at)  # ended, its pods not gone yet
    client.force_login(bob)
    page = client.get(f"/projects/team-a/pools/{pool.pk}/")
    (notice,) = page.context["allocation"]["ending"]
    assert (notice["id"], notice["at"]) == (ended.pk, at + dt.timedelta(seconds=300))
    assert "data-ending" in page.content.decode() and "being emptied" in page.content.decode()
    Allocation.objects.filter(pk=ended.pk).update(vacated_at=at)
    assert client.get(f"/projects/team-a/pools/{pool.pk}/").context["allocation"]["ending"] == []


def test_monitoring_tab_attributes_power_by_share(client, world, bob):
    add_signals(world)
    client.force_login(bob)
    series = client.get(f"/projects/team-a/pools/{world.pools['inference'].pk}/series.json").json()
    assert [m["key"] for m in series["metrics"]] == ["sm_active_pct", "power_w"]
    (line,) = series["series"]
    assert len(line["points"]) == 12
    # Two 3g.40gb on one 300 W H100, each withholding half the GPU (4 of 8 memory slices).
    assert {k: line["points"][-1][k] for k in ("sm_active_pct", "power_w")} == {"sm_active_pct": 40.0, "power_w": 300.0}
    training = client.get(f"/projects/team-a/pools/{world.pools['training'].pk}/series.json").json()
    assert {k: training["series"][0]["points"][0][k] for k in ("sm_active_pct", "power_w")} == {
        "sm_active_pct": 40.0,
        "power_w": 300.0,
    }


def test_costs_show_only_the_members_projects(client, world, bob):
    add_signals(world)
    client.force_login(bob)
    costs = client.get("/projects/").context["costs"]
    assert [(i["project"], i["total"], i["used"]) for i in costs["items"]] == [("team-a", "3.12", "1.25")]
    assert costs["rows"][0][0] == {"value": "team-a", "num": False, "datetime": False}
    assert "0.36" not in client.get("/projects/").content.decode()


def test_a_queued_request_shows_its_likely_start(client, project, bob):
    from pools import services
    from pools.models import QueueEntry

    request = services.create_request(
        project, actor=bob, submit=True, isolation="full", spec_kind="full", product="H100-80GB", wait_if_full=True
    )
    services.transition(request, "queued", None, "queued")
    start = timezone.now().replace(year=2031, month=1, day=2, hour=3, minute=4)
    QueueEntry.objects.create(request=request, queued_at=timezone.now(), forecast_p50=start, forecast_p90=start)
    client.force_login(bob)
    page = client.get(f"/projects/{project.slug}/").content.decode()
    assert "likely start 2031-01-02 03:04" in page
