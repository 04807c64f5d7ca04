"""Statements API: members see their own projects' statements only (another project's is a 404);
operators see the fleet and alone generate, finalise and adjust."""

from decimal import Decimal

import pytest
from billing_helpers import at, month
from rest_framework.test import APIClient

from billing import services
from billing.choices import StatementState
from billing.models import Statement, StatementLine

pytestmark = pytest.mark.django_db


@pytest.fixture
def statements(project, other_project, allocate):
    allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    allocate(other_project, "2026-03-10 10:00", "2026-03-10 11:00")
    services.meter_usage(now=at("2026-03-10 13:00"))
    return services.generate_statements(month("2026-03"))


def client_for(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_member_lists_only_own_projects_statements(statements, bob, project):
    response = client_for(bob).get("/api/v1/billing/statements/")
    assert response.status_code == 200
    assert [(s["project_slug"], s["period"], s["total_amount"]) for s in response.json()["results"]] == [
        ("team-a", "2026-03-01", "5.00")
    ]


def test_member_of_a_gets_404_for_b(statements, bob, other_project):
    theirs = Statement.objects.get(project=other_project)
    client = client_for(bob)
    assert client.get(f"/api/v1/billing/statements/{theirs.pk}/").status_code == 404
    assert client.get(f"/api/v1/billing/statements/{theirs.pk}/download/?fmt=csv").status_code == 404
    assert client.get(f"/api/v1/billing/statements/export/?project={other_project.pk}").getvalue().decode() == (
        '"project","period","statement","state","currency","line_type","pool","kind","product","profile_name",'
        '"replicas","description","hourly_rate","hours","amount","used_amount","idle_amount","unmeasured_amount",'
        '"sm_activity","energy_kwh","reason","usage_period"\r\n'
    )  # the header alone: no row of the other project


def test_usage_records_are_scoped_too(statements, charlie, other_project):
    response = client_for(charlie).get("/api/v1/billing/usage/")
    assert {r["project"] for r in response.json()["results"]} == {other_project.pk}
    assert response.json()["count"] == 1


def test_operator_sees_the_fleet_and_exports_it(statements, operator):
    client = client_for(operator)
    assert client.get("/api/v1/billing/statements/").json()["count"] == 2
    exported = client.get("/api/v1/billing/statements/export/?fmt=json&period=2026-03").json()
    assert [(s["project"], s["total_amount"], len(s["lines"])) for s in exported] == [
        ("team-a", "5.00", 1),
        ("team-b", "2.50", 1),
    ]


def test_member_cannot_finalise_generate_or_adjust(statements, bob, project, django_capture_on_commit_callbacks):
    mine = Statement.objects.get(project=project)
    client = client_for(bob)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert client.post(f"/api/v1/billing/statements/{mine.pk}/finalise/").status_code == 403
        assert (
            client.post(
                f"/api/v1/billing/statements/{mine.pk}/adjust/", {"amount": "-1.00", "reason": "please"}
            ).status_code
            == 403
        )
        assert (
            client.post("/api/v1/billing/statements/generate/", {"project": "team-a", "period": "2026-03"}).status_code
            == 403
        )
        assert client.post("/api/v1/billing/runs/", {"period": "2026-03"}).status_code == 403
    assert callbacks == []
    mine.refresh_from_db()
    assert (mine.state, mine.total_amount, mine.lines.count()) == (StatementState.DRAFT, Decimal("5.00"), 1)


def test_operator_finalises_once_then_409(statements, operator, project):
    mine = Statement.objects.get(project=project)
    client = client_for(operator)
    first = client.post(f"/api/v1/billing/statements/{mine.pk}/finalise/")
    second = client.post(f"/api/v1/billing/statements/{mine.pk}/finalise/")
    assert (first.status_code, first.json()["state"]) == (200, "finalised")
    assert second.status_code == 409
    regenerate = client.post("/api/v1/billing/statements/generate/", {"project": "team-a", "period": "2026-03"})
    assert regenerate.status_code == 409


def test_operator_adjusts_and_bad_input_is_400(statements, operator, project):
    mine = Statement.objects.get(project=project)
    client = client_for(operator)
    url = f"/api/v1/billing/statements/{mine.pk}/adjust/"
    bad = client.post(url, {"amount": "0.001", "reason": ""})
    assert bad.status_code == 400
    assert set(bad.json()) == {"amount", "reason"}
    assert client.post(url, {"amount": "0", "reason": "x"}).json() == {
        "amount": ["An adjustment of zero changes nothing."]
    }
    assert StatementLine.objects.filter(statement=mine).count() == 1

    good = client.post(url, {"amount": "-1.25", "reason": "Goodwill"})
    assert good.status_code == 201
    assert (good.json()["amount"], good.json()["statement"]) == ("-1.25", mine.pk)
    mine.refresh_from_db()
    assert mine.total_amount == Decimal("3.75")


def test_operator_generates_on_demand(operator, project, allocate):
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    services.meter_usage(now=at("2026-03-10 12:00"))

    response = client_for(operator).post(
        "/api/v1/billing/statements/generate/", {"project": "team-a", "period": "2026-03"}
    )

    assert response.status_code == 200
    assert (response.json()["total_amount"], len(response.json()["lines"])) == ("2.50", 1)
    bad = client_for(operator).post("/api/v1/billing/statements/generate/", {"project": "nope", "period": "2026-13"})
    assert bad.status_code == 400
    assert set(bad.json()) == {"project", "period"}


def test_operator_closes_a_month_in_the_background(operator, django_capture_on_commit_callbacks):
    from billing.models import BillingRun

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client_for(operator).post("/api/v1/billing/runs/", {"period": "2026-03"})
    assert response.status_code == 202
    run = BillingRun.objects.get()
    assert (response.json()["period"], run.kind, run.status, run.requested_by) == (
        "2026-03",
        "close",
        "running",
        operator,
    )
    assert len(callbacks) == 1


def test_list_query_count_does_not_grow_with_statements(
    project, other_project, allocate, bob, operator, django_assert_num_queries
):
    for day in range(1, 4):
        allocate(project, f"2026-0{day}-10 10:00", f"2026-0{day}-10 11:00")
    services.meter_usage(now=at("2026-03-11 00:00"))
    for period in ("2026-01", "2026-02", "2026-03"):
        services.generate_statements(month(period))
    client = client_for(bob)
    # bob's project ids (read once per request), COUNT(*), the page
    with django_assert_num_queries(3):
        assert client.get("/api/v1/billing/statements/").json()["count"] == 3
    with django_assert_num_queries(3):
        assert client.get("/api/v1/billing/statements/?period=2026-03").json()["count"] == 1
