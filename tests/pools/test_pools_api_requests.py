"""Pool requests through the API: create, submit, withdraw, approve, reject; bad input is a 400 that writes nothing."""

import datetime as dt

import pytest
from django.utils import timezone

from pools.models import PoolRequest, PoolRequestTransition

pytestmark = pytest.mark.django_db

URL = "/api/v1/pool-requests/"


@pytest.fixture
def body(project):
    return {
        "project": project.pk,
        "product": "H100-80GB",
        "profile_name": "3g.40gb",
        "count": 2,
        "justification": "LLM inference for the search team",
    }


def test_create_a_draft_and_submit_it(api, bob, body):
    client = api(bob)
    response = client.post(URL, body, format="json")
    assert response.status_code == 201, response.data
    created = response.data
    assert (created["state"], created["spec"], created["tier"], created["spec_kind"], created["requested_by"]) == (
        "draft",
        "H100-80GB 3g.40gb",
        "1",
        "mig",
        "bob",
    )
    assert created["transitions"] == []
    submitted = client.post(f"{URL}{created['id']}/submit/", {"reason": "ready"}, format="json")
    assert submitted.status_code == 200
    assert submitted.data["state"] == "submitted"
    assert [(t["from_state"], t["to_state"], t["actor"], t["reason"]) for t in submitted.data["transitions"]] == [
        ("draft", "submitted", "bob", "ready")
    ]


def test_create_submitted_at_once_from_declared_memory(api, bob, body):
    del body["profile_name"]
    response = api(bob).post(URL, {**body, "memory_gib": 30, "submit": True}, format="json")
    assert response.status_code == 201, response.data
    assert (response.data["state"], response.data["profile_name"]) == ("submitted", "3g.40gb")


@pytest.mark.parametrize(
    ("change", "errors"),
    [
        ({"profile_name": "5g.55gb"}, {"profile_name"}),
        ({"product": "B9000"}, {"product"}),
        ({"count": 0}, {"count"}),
        ({"count": -3}, {"count"}),
        ({"start_at": "2031-01-02T00:00:00Z", "end_at": "2031-01-01T00:00:00Z"}, {"end_at"}),
        ({"end_at": "2020-01-01T00:00:00Z"}, {"end_at"}),
        ({"isolation": "full", "profile_name": "3g.40gb"}, {"profile_name"}),
        ({"isolation": "quantum"}, {"isolation"}),
        ({"cluster": 999999}, {"cluster"}),
        ({"project": 999999}, {"project"}),
        ({"profile_name": "", "memory_gib": 900}, {"memory_gib"}),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(api, bob, body, change, errors):
    response = api(bob).post(URL, {**body, **change}, format="json")
    assert response.status_code == 400
    assert set(response.data) == errors
    assert not PoolRequest.objects.exists()


def test_unknown_profile_message(api, bob, body):
    response = api(bob).post(URL, {**body, "profile_name": "5g.55gb"}, format="json")
    assert response.data["profile_name"] == [
        "H100-80GB has no MIG profile '5g.55gb'; known: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, "
        "7g.80gb"
    ]
    response = api(bob).post(URL, {**body, "start_at": "2031-01-02T00:00:00Z", "end_at": "2031-01-01T00:00Z"})
    assert response.data == {"end_at": ["The end must be after the start."]}


def test_illegal_transitions_are_409_and_change_nothing(api, bob, operator, make_request):
    request = make_request(state="draft")
    assert api(bob).post(f"{URL}{request.pk}/withdraw/").status_code == 200
    before = PoolRequestTransition.objects.count()
    response = api(bob).post(f"{URL}{request.pk}/submit/")
    assert response.status_code == 409
    assert response.data == {
        "detail": f"Pool request #{request.pk} is withdrawn; it cannot become submitted.",
        "state": "withdrawn",
        "to_state": "submitted",
    }
    assert api(operator).post(f"{URL}{request.pk}/approve/").status_code == 409
    assert PoolRequestTransition.objects.count() == before
    request.refresh_from_db()
    assert request.state == "withdrawn"


def test_approval_short_of_capacity_is_a_409_saying_what_is_missing(
    api, operator, make_request, fleet, django_capture_on_commit_callbacks
):
    fleet.mig_node("n1", [["4g.40gb", "3g.40gb"]])
    request = make_request(count=2)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api(operator).post(f"{URL}{request.pk}/approve/", {"reason": "go"}, format="json")
    assert response.status_code == 409
    assert response.data["detail"].startswith("need 2 x H100-80GB 3g.40gb, 1 free; reconfiguring GPUs GPU-")
    assert (response.data["need"], response.data["free"], response.data["free_by_cluster"]) == (2, 1, {"c1": 1})
    assert callbacks == []
    request.refresh_from_db()
    assert request.state == "submitted"


def test_approve_with_a_cluster_and_reason(api, operator, make_request, fleet, django_capture_on_commit_callbacks):
    fleet.mig_node("a", [["3g.40gb", "3g.40gb"]], cluster="alpha")
    fleet.mig_node("b", [["3g.40gb", "3g.40gb"]], cluster="beta")
    request = make_request(count=2)
    beta = fleet.cluster("beta")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api(operator).post(f"{URL}{request.pk}/approve/", {"reason": "ok", "cluster": beta.pk})
    assert response.status_code == 200, response.data
    assert response.data["state"] == "provisioning"
    assert response.data["approved_by"] == "operator"
    assert response.data["pool"] is not None
    assert [(cb.func.__self__.name, cb.args) for cb in callbacks if cb.func.__self__.name.startswith("pools.")] == [
        ("pools.tasks.provision_pool_task", (response.data["pool"],))
    ]
    pool = api(operator).get(f"/api/v1/pools/{response.data['pool']}/").data
    assert (pool["cluster_name"], pool["profiles_total"], pool["spec"]) == ("beta", 2, "H100-80GB 3g.40gb")


def test_reject_needs_a_reason(api, operator, make_request):
    request = make_request()
    assert api(operator).post(f"{URL}{request.pk}/reject/", {}).data == {"reason": ["This field is required."]}
    response = api(operator).post(f"{URL}{request.pk}/reject/", {"reason": "no budget"})
    assert (response.status_code, response.data["state"], response.data["state_reason"]) == (
        200,
        "rejected",
        "no budget",
    )


def test_filters_and_pagination(api, bob, make_request):
    for _ in range(3):
        make_request()
    make_request(state="draft")
    client = api(bob)
    page = client.get(URL, {"state": "submitted", "page_size": 2}).data
    assert (page["count"], len(page["results"])) == (3, 2)
    assert client.get(URL, {"state": ["draft", "submitted"]}).data["count"] == 4
    assert client.get(URL, {"state": "bogus"}).status_code == 400
    newest = client.get(URL, {"ordering": "-id"}).data["results"][0]["id"]
    assert newest == PoolRequest.objects.order_by("-id").first().pk
    later = (timezone.now() + dt.timedelta(hours=1)).isoformat()
    assert client.get(URL, {"created_after": later}).data["count"] == 0
