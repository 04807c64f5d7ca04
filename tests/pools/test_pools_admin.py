"""The operator console: the approval queue, bulk approve/reject with a reason page, pools, membership."""

import pytest
from django.contrib.admin import helpers
from django.urls import reverse

from pools import services
from pools.models import GpuPool, PoolRequest
from tenancy.roles import role_of

pytestmark = pytest.mark.django_db
QUEUE = reverse("admin:pools_poolrequest_changelist")


@pytest.fixture
def admin_client(client, operator):
    client.force_login(operator)
    return client


def test_the_queue_lists_pending_requests_first(admin_client, make_request):
    draft = make_request(state="draft")
    pending = make_request()
    newest_draft = make_request(state="draft")
    page = admin_client.get(QUEUE)
    assert [r.pk for r in page.context["cl"].result_list] == [pending.pk, newest_draft.pk, draft.pk]
    pending_only = admin_client.get(QUEUE, {"queue": "pending"})
    assert [r.pk for r in pending_only.context["cl"].result_list] == [pending.pk]


def test_bulk_approve_asks_for_a_reason_then_approves_and_reports(
    admin_client, fleet, make_request, operator, django_capture_on_commit_callbacks
):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    fits = make_request(count=2)
    too_big = make_request(count=2)
    selected = {"action": "approve_selected", helpers.ACTION_CHECKBOX_NAME: [fits.pk, too_big.pk]}
    form_page = admin_client.post(QUEUE, selected)
    assert form_page.status_code == 200
    assert form_page.templates[0].name == "admin/pools/reason_form.html"
    assert PoolRequest.objects.get(pk=fits.pk).state == "submitted"
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        done = admin_client.post(QUEUE, {**selected, "apply": "1", "reason": "capacity plan Q3"}, follow=True)
    texts = [str(m) for m in done.context["messages"]]
    assert texts[0] == "1 pool request approved."
    assert texts[1].startswith(f"Refused: #{too_big.pk}: need 2 x H100-80GB 3g.40gb, 0 free")
    fits.refresh_from_db()
    assert (fits.state, fits.approved_by, fits.transitions.get(to_state="approved").reason) == (
        "provisioning",
        operator,
        "capacity plan Q3",
    )
    # One provisioning (the notifications app also enqueues its deliveries of the approval).
    assert [cb.func.__self__.name for cb in callbacks if not cb.func.__self__.name.startswith("notifications.")] == [
        "pools.tasks.provision_pool_task"
    ]


def test_bulk_reject_requires_a_reason(admin_client, make_request):
    request = make_request()
    selected = {"action": "reject_selected", helpers.ACTION_CHECKBOX_NAME: [request.pk], "apply": "1"}
    again = admin_client.post(QUEUE, {**selected, "reason": ""})
    assert again.status_code == 200 and again.context["form"].errors == {"reason": ["This field is required."]}
    assert PoolRequest.objects.get(pk=request.pk).state == "submitted"
    admin_client.post(QUEUE, {**selected, "reason": "over budget"})
    request.refresh_from_db()
    assert (request.state, request.state_reason) == ("rejected", "over budget")


def test_pool_pages_and_retry_action(admin_client, fleet, make_request, operator, django_capture_on_commit_callbacks):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    pool = services.approve(make_request(count=2), actor=operator)
    services.mark_failed(pool, "Kubernetes: boom")
    changelist = reverse("admin:pools_gpupool_changelist")
    page = admin_client.get(changelist)
    assert b"0/2" in page.content
    assert admin_client.get(reverse("admin:pools_gpupool_change", args=[pool.pk])).status_code == 200
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        done = admin_client.post(
            changelist, {"action": "retry_provisioning", helpers.ACTION_CHECKBOX_NAME: [pool.pk]}, follow=True
        )
    assert [str(m) for m in done.context["messages"]] == ["1 pools queued for provisioning."]
    assert GpuPool.objects.get(pk=pool.pk).state == "provisioning"
    assert len(callbacks) == 1


def test_membership_page_sets_roles(admin_client, project, bob, django_user_model):
    url = reverse("admin:tenancy_project_members", args=[project.pk])
    page = admin_client.get(url)
    assert page.status_code == 200 and b"bob" in page.content
    dana = django_user_model.objects.create_user("dana")
    admin_client.post(url, {"username": "dana", "role": "viewer"})
    assert role_of(project, dana) == "viewer"
    admin_client.post(url, {"username": "bob", "role": ""})
    assert role_of(project, bob) is None
    assert admin_client.post(url, {"username": "nobody", "role": "admin"}).context["form"].errors == {
        "username": ["No such user."]
    }


def test_the_projects_changelist_counts_held_pools_only(admin_client, fleet, make_request, operator, project):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    services.approve(make_request(count=1), actor=operator)
    released = services.approve(make_request(count=1), actor=operator)
    services.release(released.request, actor=operator)
    page = admin_client.get(reverse("admin:tenancy_project_changelist"))
    assert page.status_code == 200
    assert {p.slug: p.held_pools for p in page.context["cl"].result_list} == {project.slug: 1}
