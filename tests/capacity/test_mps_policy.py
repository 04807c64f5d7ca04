"""Operators choose MPS next to time-slicing (issue #30): clients per GPU, pinned memory and active-thread limits,
in the API (bad values: 400 with field messages) and the admin; members and outsiders cannot set policy."""

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from capacity.models import Cluster, TimeSlicingPolicy

pytestmark = pytest.mark.django_db
URL = "/api/v1/time-slicing-policies/"


@pytest.fixture
def cluster(db):
    return Cluster.objects.create(name="c1", kubeconfig_path="/tmp/c1.kubeconfig")


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_an_operator_creates_an_mps_policy_with_client_limits(operator, cluster):
    body = {
        "cluster": cluster.pk,
        "node_group": "dev",
        "strategy": "mps",
        "replicas": 4,
        "pinned_memory_limit_mib": 16384,
        "active_thread_percentage": 20,
    }
    response = client_for(operator).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    data = response.json()
    assert (data["strategy"], data["replicas"], data["config_key"]) == ("mps", 4, "gpuaas-dev-mps-x4")
    assert data["client_environment"] == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16384M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
    }
    listed = client_for(operator).get(URL, {"strategy": "mps"}).json()["results"]
    assert [p["id"] for p in listed] == [data["id"]]
    plain = client_for(operator).post(URL, {"cluster": cluster.pk, "replicas": 4}, format="json").json()
    assert (plain["strategy"], plain["client_environment"]) == ("time-slicing", {})


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        (
            {"strategy": "mps", "replicas": 4, "active_thread_percentage": 30},
            {
                "active_thread_percentage": [
                    "Give 1 to 25: with 4 clients per GPU the MPS daemon already caps each at 25 %, and a client's "
                    "own limit can only be lower."
                ]
            },
        ),
        (
            {"replicas": 4, "pinned_memory_limit_mib": 8000},
            {
                "pinned_memory_limit_mib": [
                    "Only an MPS policy limits its clients; set strategy to mps or leave this empty."
                ]
            },
        ),
        ({"strategy": "mps", "replicas": 4, "pinned_memory_limit_mib": 0}, {"pinned_memory_limit_mib": None}),
        ({"strategy": "mps", "replicas": 4, "active_thread_percentage": 0}, {"active_thread_percentage": None}),
        ({"strategy": "mps", "replicas": 1}, {"replicas": None}),
        ({"strategy": "mps", "replicas": 65}, {"replicas": None}),
        ({"strategy": "mig", "replicas": 4}, {"strategy": None}),
    ],
    ids=["threads-above-the-daemons", "limits-on-time-slicing", "no-memory", "no-threads", "one-client", "65", "mig"],
)
def test_bad_mps_values_are_400_with_field_messages(operator, cluster, body, errors):
    response = client_for(operator).post(URL, {"cluster": cluster.pk, **body}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == set(errors)
    for field, messages in errors.items():
        if messages is not None:
            assert response.json()[field] == messages
    assert not TimeSlicingPolicy.objects.exists()


def test_a_change_is_checked_against_what_the_policy_already_holds(operator, cluster):
    policy = TimeSlicingPolicy.objects.create(cluster=cluster, strategy="mps", replicas=4, active_thread_percentage=20)
    url = f"{URL}{policy.pk}/"
    to_time_slicing = client_for(operator).patch(url, {"strategy": "time-slicing"}, format="json")
    assert to_time_slicing.status_code == 400
    assert list(to_time_slicing.json()) == ["active_thread_percentage"]
    more_clients = client_for(operator).patch(url, {"replicas": 8}, format="json")  # 20 % > 100 / 8
    assert more_clients.status_code == 400 and list(more_clients.json()) == ["active_thread_percentage"]
    policy.refresh_from_db()
    assert (policy.strategy, policy.replicas) == ("mps", 4)
    ok = client_for(operator).patch(url, {"replicas": 5}, format="json")
    assert ok.status_code == 200, ok.data


def test_the_database_refuses_limits_on_a_time_slicing_policy(cluster):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        TimeSlicingPolicy.objects.create(cluster=cluster, replicas=4, active_thread_percentage=10)


def test_members_and_outsiders_cannot_set_sharing_policy(bob, alice, charlie, cluster):
    body = {"cluster": cluster.pk, "strategy": "mps", "replicas": 4}
    for user in (bob, alice, charlie):
        assert client_for(user).post(URL, body, format="json").status_code == 403
    policy = TimeSlicingPolicy.objects.create(cluster=cluster, strategy="mps", replicas=4)
    assert client_for(bob).patch(f"{URL}{policy.pk}/", {"replicas": 2}, format="json").status_code == 403
    policy.refresh_from_db()
    assert policy.replicas == 4 and TimeSlicingPolicy.objects.count() == 1


def test_the_admin_offers_mps_and_refuses_bad_limits_with_the_fields_message(operator, cluster, client):
    client.force_login(operator)
    page = client.get(reverse("admin:capacity_timeslicingpolicy_add")).content.decode()
    for field in ("strategy", "pinned_memory_limit_mib", "active_thread_percentage"):
        assert f'name="{field}"' in page
    assert '<option value="mps">' in page
    form = {
        "cluster": cluster.pk,
        "node_group": "dev",
        "strategy": "mps",
        "replicas": 4,
        "active_thread_percentage": 40,
        "fail_requests_greater_than_one": "on",
        "enabled": "on",
    }
    refused = client.post(reverse("admin:capacity_timeslicingpolicy_add"), form)
    assert refused.status_code == 200
    assert "Give 1 to 25" in refused.content.decode()
    assert not TimeSlicingPolicy.objects.exists()
    saved = client.post(reverse("admin:capacity_timeslicingpolicy_add"), {**form, "active_thread_percentage": 25})
    assert saved.status_code == 302
    policy = TimeSlicingPolicy.objects.get()
    assert (policy.strategy, policy.active_thread_percentage) == ("mps", 25)
