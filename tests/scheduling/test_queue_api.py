"""The queue through the API: waiting instead of refusal, the queue in order, the dry-run forecast,
operators' queue actions and auto-approval policies (operators only)."""

import datetime as dt

import pytest
from django.conf import settings

from pools import services
from pools.models import AutoApprovalPolicy, PoolRequest, QueueEvent

pytestmark = pytest.mark.django_db

URL = "/api/v1/pool-requests/"
POLICIES = "/api/v1/auto-approval-policies/"


@pytest.fixture
def full_fleet(fleet, make_request, operator):
    """One MIG GPU with two 3g.40gb instances, both held: a new 3g.40gb request waits."""
    fleet.mig_node("m1", [["3g.40gb", "3g.40gb"]])
    services.approve(make_request(count=2), actor=operator)


@pytest.fixture
def body(project):
    return {"project": project.pk, "product": "H100-80GB", "profile_name": "3g.40gb", "count": 1}


def test_a_waiting_request_is_queued_and_shows_its_place_and_forecast(api, bob, body, full_fleet):
    response = api(bob).post(URL, {**body, "wait_if_full": True, "submit": True}, format="json")
    assert response.status_code == 201, response.data
    assert response.data["state"] == "queued"
    assert response.data["queue"]["position"] == 1
    assert response.data["queue"]["on_hold"] is False
    assert response.data["queue"]["can_be_approved_now"] is False
    assert response.data["queue"]["forecast_p50"] is not None
    queued_at = dt.datetime.fromisoformat(response.data["queue"]["queued_at"])
    aged_from = dt.datetime.fromisoformat(response.data["queue"]["served_by_age_from"])
    assert aged_from - queued_at == dt.timedelta(hours=settings.QUEUE_AGED_AFTER_H)
    listed = api(bob).get(f"{URL}queue/")
    assert [(r["id"], r["queue"]["position"]) for r in listed.data] == [(response.data["id"], 1)]


def test_the_queue_shows_outsiders_nothing(api, bob, charlie, body, full_fleet):
    api(bob).post(URL, {**body, "wait_if_full": True, "submit": True}, format="json")
    assert api(charlie).get(f"{URL}queue/").data == []


def test_dry_run_forecast_writes_nothing(api, bob, body, full_fleet):
    before = PoolRequest.objects.count()
    response = api(bob).post(f"{URL}forecast/", {**body, "count": 4}, format="json")
    assert response.status_code == 200, response.data
    assert response.data["basis"]["need"] == 4
    assert response.data["p50"] is None  # the fleet has two such units: four never fit
    assert PoolRequest.objects.count() == before
    fits = api(bob).post(f"{URL}forecast/", {**body, "count": 1}, format="json")
    assert fits.data["basis"]["free_now"] == 0


def test_dry_run_forecast_bad_input_is_400_with_field_messages(api, bob, body):
    response = api(bob).post(f"{URL}forecast/", {**body, "profile_name": "5g.55gb"}, format="json")
    assert response.status_code == 400
    assert "profile_name" in response.data


def test_operators_hold_move_and_cancel_members_may_not(api, bob, operator, body, full_fleet):
    ids = [
        api(bob).post(URL, {**body, "wait_if_full": True, "submit": True}, format="json").data["id"] for _ in range(2)
    ]
    assert api(bob).post(f"{URL}{ids[0]}/hold/", {}, format="json").status_code == 403
    held = api(operator).post(f"{URL}{ids[0]}/hold/", {"reason": "check"}, format="json")
    assert held.status_code == 200 and held.data["queue"]["on_hold"] is True
    again = api(operator).post(f"{URL}{ids[0]}/hold/", {}, format="json")
    assert again.status_code == 409
    moved = api(operator).post(f"{URL}{ids[1]}/move/", {"position": 1}, format="json")
    assert moved.status_code == 200 and moved.data["queue"]["position"] == 1
    assert api(operator).post(f"{URL}{ids[1]}/move/", {"position": 0}, format="json").status_code == 400
    assert api(operator).post(f"{URL}{ids[0]}/unhold/", {}, format="json").status_code == 200
    assert api(operator).post(f"{URL}{ids[0]}/cancel/", {}, format="json").status_code == 400
    cancelled = api(operator).post(f"{URL}{ids[0]}/cancel/", {"reason": "duplicate"}, format="json")
    assert cancelled.status_code == 200 and cancelled.data["state"] == "rejected"
    actions = list(QueueEvent.objects.filter(request_id=ids[0]).values_list("action", flat=True))
    assert actions == ["queued", "held", "unheld", "cancelled"]
    assert QueueEvent.objects.filter(request_id=ids[1], action="moved").count() == 1


def test_policies_are_for_operators_only(api, bob, operator, project):
    assert api(bob).get(POLICIES).status_code == 403
    created = api(operator).post(
        POLICIES,
        {"name": "dev", "projects": [project.pk], "max_units": 2, "window_start": "09:00", "window_end": "17:00"},
        format="json",
    )
    assert created.status_code == 201, created.data
    bad = api(operator).post(POLICIES, {"name": "half", "window_start": "09:00"}, format="json")
    assert bad.status_code == 400 and "window_end" in bad.data
    assert api(bob).post(POLICIES, {"name": "mine"}, format="json").status_code == 403
    assert AutoApprovalPolicy.objects.count() == 1


def test_a_policy_that_approved_requests_cannot_be_deleted(api, operator, make_request, fleet):
    fleet.mig_node("m1", [["3g.40gb", "3g.40gb"]])
    policy = AutoApprovalPolicy.objects.create(name="all")
    services.approve(make_request(count=1), actor=None, policy=policy)
    assert api(operator).delete(f"{POLICIES}{policy.pk}/").status_code == 409
    assert AutoApprovalPolicy.objects.filter(pk=policy.pk).exists()
