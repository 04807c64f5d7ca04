"""GET /api/v1/capacity-plan/: the live plan per tier for operators, nothing for members, a fixed query count."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from pool_world import Fleet
from rest_framework.test import APIClient
from tier_fleets import NodeSpec, build_fleet

from capacity.models import Cluster
from capacity.services.planning import tier_plan

pytestmark = pytest.mark.django_db

URL = "/api/v1/capacity-plan/"
SMALL = [
    NodeSpec(0, "H100-80GB", "1", "mig", 2, (1, 0), 2, 0, "ok"),
    NodeSpec(1, "H200-141GB", "3", "mps", 1, (0, 0), 3, 0, "ok"),
]
LARGE = [
    *SMALL,
    NodeSpec(0, "H100-80GB", "2", "vgpu", 2, (0, 0), 2, 1, "ok"),
    NodeSpec(0, "A100-40GB", "2", "mig", 2, (1, 3), 2, 0, "cordoned"),
    NodeSpec(1, "A100-40GB", "3", "timeslice", 2, (0, 0), 2, 0, "unhealthy"),
    NodeSpec(1, "H200-141GB", "full", "full", 2, (0, 0), 2, 0, "ok"),
    NodeSpec(1, "H100-80GB", "", "mig", 2, (4, 2), 2, 0, "ok"),
]


def api_client(user=None) -> APIClient:
    api = APIClient()
    if user is not None:
        api.force_authenticate(user)
    return api


def test_operators_get_the_plan_per_tier(operator):
    build_fleet(Fleet(), {"nodes": SMALL, "pad": (1, 1), "tier2_min": 1})
    response = api_client(operator).get(URL)
    assert response.status_code == 200
    body = response.json()
    assert body["reserve_gpus"] == 1
    assert body["tiers"] == tier_plan().as_dict()["tiers"]
    tier1, tier3 = body["tiers"]
    assert {k: tier1[k] for k in ("tier", "rule", "gpus", "total", "free", "withheld", "reserve")} == {
        "tier": "1",
        "rule": "tier 1 takes 3g and larger",
        "gpus": 2,
        "total": 3,  # 3g of 3g+2g+1g+1g, and 4g+3g
        "free": 3,
        "withheld": 3,
        "reserve": 2,
    }
    assert tier3["specs"] == [
        {
            "kind": "mps",
            "product": "H200-141GB",
            "spec": "H200-141GB",
            "per_gpu": 3,
            "gpus": 1,
            "total": 3,
            "reserved": 0,
            "free": 3,
            "unavailable": 0,
        }
    ]
    assert (tier3["free_after_reserve"], tier3["unavailable"]) == (0, 0)


def test_the_cluster_filter_narrows_the_plan(operator):
    build_fleet(Fleet(), {"nodes": SMALL, "pad": (0, 0), "tier2_min": 1})
    second = Cluster.objects.get(name="c1")
    body = api_client(operator).get(URL, {"cluster": second.pk}).json()
    assert [t["tier"] for t in body["tiers"]] == ["3"]


@pytest.mark.parametrize("who", ["alice", "bob", "victor", "charlie", "staff_nobody"])
def test_members_and_staff_without_the_grant_see_nothing(who, request):
    """Fleet-wide free capacity is operator information: a project member learns what their own request would
    get from the dry run and the forecast (free now, or the wait), not the fleet's tiers."""
    build_fleet(Fleet(), {"nodes": SMALL, "pad": (0, 0), "tier2_min": 1})
    response = api_client(request.getfixturevalue(who)).get(URL)
    assert response.status_code == 403
    assert "tiers" not in response.json()


def test_anonymous_callers_are_refused(db):
    assert api_client().get(URL).status_code in (401, 403)


def test_staff_operator_group_may_read_it(staff_operator):
    assert api_client(staff_operator).get(URL).status_code == 200


def _queries(api) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert api.get(URL).status_code == 200
    return len(captured)


def test_query_count_does_not_grow_with_the_fleet(operator, django_assert_max_num_queries):
    """The plan is SQL aggregates: eleven queries for the plan, plus the layouts' two, whatever the fleet."""
    api = api_client(operator)
    rows = Fleet()
    build_fleet(rows, {"nodes": SMALL, "pad": (0, 0), "tier2_min": 1})
    small = _queries(api)
    build_fleet(rows, {"nodes": LARGE, "pad": (2, 3), "tier2_min": 2}, prefix="big")
    with django_assert_max_num_queries(small):
        api.get(URL)
    with django_assert_max_num_queries(16):
        tier_plan()


def test_the_admin_page_and_dashboard_show_the_same_figures(operator, client):
    build_fleet(Fleet(), {"nodes": LARGE, "pad": (0, 0), "tier2_min": 1})
    client.force_login(operator)
    plan = tier_plan()
    page = client.get(reverse("admin:capacity_capacity_plan")).content.decode()
    for figures in plan.tiers:
        assert f"<td>{figures.label}</td><td>{figures.rule}</td><td>{figures.gpus}</td><td>{figures.total}</td>" in page
    data = client.get(reverse("admin:gpuaas_dashboard_data")).json()["capacity_plan"]
    assert [(i["tier"], i["total"], i["free"], i["reserve"]) for i in data["items"]] == [
        (t.label, t.total, t.free, t.reserve) for t in plan.tiers
    ]


def test_the_command_prints_the_live_plan():
    build_fleet(Fleet(), {"nodes": SMALL, "pad": (0, 0), "tier2_min": 1})
    out = StringIO()
    call_command("capacity-plan", "--live", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "maintenance reserve: 1 GPU(s) per cluster and tier"
    assert lines[1] == (
        "  Tier 1: MIG, SLA inference (tier 1 takes 3g and larger): 3 units on 2 GPUs, 0 reserved, 3 free,"
        " 0 unavailable, 3 withheld by tier policy, reserve 2, 1 free after it"
    )
    out = StringIO()
    call_command("capacity-plan", "--live", "--json", stdout=out)
    assert json.loads(out.getvalue()) == tier_plan().as_dict()
    with pytest.raises(CommandError, match="Give --product and --gpus for a proposal, or --live"):
        call_command("capacity-plan", "--product", "H100-80GB")
