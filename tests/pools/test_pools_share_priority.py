"""Operators choose a time-sliced or MPS pool's share priority (issue #30): API and admin, members cannot; the pool's
ConfigMap names the matching Kubernetes PriorityClass, which provisioning creates."""

import pytest
from django.urls import reverse

from capacity.models import NodeCapacity
from pools import provisioning, services
from pools.models import GpuPool

pytestmark = pytest.mark.django_db
URL = "/api/v1/pools/"


@pytest.fixture
def shared_pool(fleet, make_request, operator):
    fleet.timeslice_node("ts", gpus=1, replicas=4)
    return services.approve(make_request(isolation="timeslice", profile_name="", count=2), actor=operator)


def test_an_operator_sets_the_share_priority_and_the_project_is_reconciled_after_commit(
    api, operator, shared_pool, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api(operator).post(f"{URL}{shared_pool.pk}/share-priority/", {"share_priority": "high"})
    assert response.status_code == 200, response.data
    assert (response.data["share_priority"], response.data["priority_class"]) == ("high", "gpuaas-shared-high")
    assert len(callbacks) == 1  # reconcile_project_task for the pool's cluster
    shared_pool.refresh_from_db()
    assert shared_pool.share_priority == "high"
    data = provisioning.desired_state(shared_pool.project, shared_pool.cluster)
    assert data.placements[f"gpuaas-pool-{shared_pool.pk}"]["priorityClassName"] == "gpuaas-shared-high"
    assert data.priority_classes == {"gpuaas-shared-high": 2000}
    with django_capture_on_commit_callbacks(execute=False) as again:
        assert (
            api(operator).post(f"{URL}{shared_pool.pk}/share-priority/", {"share_priority": "high"}).status_code == 200
        )
    assert again == []  # unchanged: nothing to reconcile


def test_members_and_project_admins_cannot_set_a_share_priority(
    api, alice, bob, charlie, shared_pool, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        for user, status in ((alice, 403), (bob, 403), (charlie, 404)):  # an outsider does not see the pool
            response = api(user).post(f"{URL}{shared_pool.pk}/share-priority/", {"share_priority": "high"})
            assert response.status_code == status, (user, response.status_code)
    assert callbacks == []
    shared_pool.refresh_from_db()
    assert shared_pool.share_priority == "normal"
    assert api(bob).get(f"{URL}{shared_pool.pk}/").data["share_priority"] == "normal"  # members can read it


def test_a_bad_priority_or_a_pool_that_is_not_shared_is_a_400(api, operator, shared_pool, fleet, make_request):
    bad = api(operator).post(f"{URL}{shared_pool.pk}/share-priority/", {"share_priority": "urgent"})
    assert bad.status_code == 400 and list(bad.data) == ["share_priority"]
    fleet.mig_node("mig", [["3g.40gb", "3g.40gb"]])
    mig_pool = services.approve(make_request(count=1), actor=operator)
    refused = api(operator).post(f"{URL}{mig_pool.pk}/share-priority/", {"share_priority": "low"})
    assert refused.status_code == 400
    assert refused.data == {"share_priority": ["Only time-sliced and MPS pools have a share priority."]}
    assert api(operator).get(f"{URL}{mig_pool.pk}/").data["priority_class"] is None
    assert set(GpuPool.objects.values_list("share_priority", flat=True)) == {"normal"}


def test_mps_pools_have_a_share_priority_too(api, operator, fleet, make_request):
    mps = fleet.timeslice_node("mps", gpus=1, replicas=4)
    NodeCapacity.objects.filter(pk=mps.pk).update(sharing_strategy="mps")
    pool = services.approve(make_request(isolation="mps", profile_name="", count=1), actor=operator)
    assert pool.request.spec_kind == "mps"
    response = api(operator).post(f"{URL}{pool.pk}/share-priority/", {"share_priority": "low"})
    assert response.status_code == 200 and response.data["priority_class"] == "gpuaas-shared-low"


def test_the_admin_action_sets_shared_pools_and_skips_the_others(client, operator, shared_pool, fleet, make_request):
    fleet.mig_node("mig", [["3g.40gb", "3g.40gb"]])
    mig_pool = services.approve(make_request(count=1), actor=operator)
    client.force_login(operator)
    response = client.post(
        reverse("admin:pools_gpupool_changelist"),
        {"action": "share_priority_low", "_selected_action": [shared_pool.pk, mig_pool.pk]},
        follow=True,
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "1 pools now have low share priority." in page
    assert f"Not time-sliced or MPS (no share priority): {mig_pool.name}" in page
    assert dict(GpuPool.objects.values_list("pk", "share_priority")) == {shared_pool.pk: "low", mig_pool.pk: "normal"}
