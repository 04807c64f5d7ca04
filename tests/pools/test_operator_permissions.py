"""Staff status alone grants nothing: every operator-only API route, admin action and page asks for a
model permission. staff_nobody (is_staff, no permission, no role) is refused and nothing changes;
staff_operator (is_staff + the Operators group, not a superuser) is allowed.
"""

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.urls import reverse

from billing.models import BillingRun, Statement, StatementLine
from capacity.models import MaintenanceWindow, MigLayout, MigReconfiguration, TimeSlicingPolicy
from monitoring.models import HealthEvent
from pools import services
from pools.models import GpuPool, PoolRequest, PoolRequestTransition
from tenancy.roles import OPERATORS_GROUP, operator_can, sees_all_projects

pytestmark = pytest.mark.django_db

# Operator-only API routes of every app; the bodies are empty (a refusal comes before validation).
OPERATOR_ROUTES = [
    ("get", "/api/v1/capacity/clusters/"),
    ("get", "/api/v1/capacity/discovery-runs/"),
    ("get", "/api/v1/capacity/nodes/"),
    ("get", "/api/v1/capacity/gpus/"),
    ("get", "/api/v1/capacity/specs/"),
    ("get", "/api/v1/capacity/specs/totals/"),
    ("get", "/api/v1/mig-layouts/"),
    ("post", "/api/v1/mig-layouts/"),
    ("get", "/api/v1/mig-reconfigurations/"),
    ("post", "/api/v1/mig-reconfigurations/"),
    ("get", "/api/v1/maintenance-windows/"),
    ("post", "/api/v1/maintenance-windows/"),
    ("get", "/api/v1/time-slicing-policies/"),
    ("post", "/api/v1/time-slicing-policies/"),
    ("get", "/api/v1/capacity-plan/"),
    ("get", "/api/v1/procurement/what-if/"),
    ("post", "/api/v1/take-offline/"),
    ("get", "/api/v1/rebalance/"),
    ("post", "/api/v1/billing/statements/generate/"),
    ("get", "/api/v1/billing/runs/"),
    ("post", "/api/v1/billing/runs/"),
]


def snapshot():
    return (
        MigLayout.objects.count(),
        MigReconfiguration.objects.count(),
        MaintenanceWindow.objects.count(),
        TimeSlicingPolicy.objects.count(),
        Statement.objects.count(),
        StatementLine.objects.count(),
        BillingRun.objects.count(),
        list(PoolRequest.objects.order_by("pk").values_list("pk", "state", "count")),
        PoolRequestTransition.objects.count(),
        list(GpuPool.objects.order_by("pk").values_list("pk", "state", "attempts")),
        list(HealthEvent.objects.order_by("pk").values_list("pk", "resolved_at")),
    )


@pytest.mark.parametrize(("method", "url"), OPERATOR_ROUTES)
def test_staff_without_permissions_is_refused_every_operator_route(
    api, staff_nobody, django_capture_on_commit_callbacks, method, url
):
    before = snapshot()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = getattr(api(staff_nobody), method)(url, {}, format="json")
    assert response.status_code == 403, response.content
    assert snapshot() == before
    assert callbacks == []


@pytest.mark.parametrize(("method", "url"), OPERATOR_ROUTES)
def test_the_operators_group_opens_every_operator_route(api, staff_operator, method, url):
    response = getattr(api(staff_operator), method)(url, {}, format="json")
    assert response.status_code in (200, 400), response.content  # 400: the empty body, checked after the permission


def test_one_permission_opens_one_route_only(api, staff_nobody):
    from django.contrib.auth.models import Permission

    staff_nobody.user_permissions.add(Permission.objects.get(codename="view_miglayout"))
    client = api(staff_nobody)
    assert client.get("/api/v1/mig-layouts/").status_code == 200
    assert client.post("/api/v1/mig-layouts/", {}, format="json").status_code == 403
    assert client.get("/api/v1/mig-reconfigurations/").status_code == 403
    assert MigLayout.objects.count() == 0


def test_approve_and_reject_need_the_approve_permission(fleet, api, make_request, staff_nobody, project):
    from django.contrib.auth.models import Permission

    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    held = make_request(count=1)
    # Sees every project, may change requests, but may not approve: still refused.
    staff_nobody.user_permissions.add(*Permission.objects.filter(codename__in=["view_project", "change_poolrequest"]))
    client = api(staff_nobody)
    before = snapshot()
    for verb in ("approve", "reject"):
        response = client.post(f"/api/v1/pool-requests/{held.pk}/{verb}/", {"reason": "x"}, format="json")
        assert response.status_code == 403, response.content
    assert snapshot() == before
    staff_nobody.user_permissions.add(Permission.objects.get(codename="approve_poolrequest"))
    client = api(type(staff_nobody).objects.get(pk=staff_nobody.pk))  # fresh user: no permission cache
    assert client.post(f"/api/v1/pool-requests/{held.pk}/approve/", {"reason": "ok"}, format="json").status_code == 200
    assert PoolRequest.objects.get(pk=held.pk).state != "submitted"


# --- The admin ---------------------------------------------------------------------------------


def _action(client, model_url, action, pks, **extra):
    return client.post(model_url, {"action": action, "_selected_action": [str(pk) for pk in pks], **extra})


def test_staff_without_permissions_get_the_admins_403_on_actions_and_pages(client, staff_nobody, make_request):
    request = make_request(count=1)
    client.force_login(staff_nobody)
    before = snapshot()
    changelist = reverse("admin:pools_poolrequest_changelist")
    assert _action(client, changelist, "approve_selected", [request.pk], apply="1").status_code == 403
    assert _action(client, changelist, "reject_selected", [request.pk], apply="1", reason="no").status_code == 403
    pages = [
        reverse("admin:capacity_rebalance"),
        reverse("admin:capacity_capacity_plan"),
        reverse("admin:pools_procurement_what_if"),
        reverse("admin:capacity_take_offline"),
        reverse("admin:capacity_migreconfiguration_add"),
        reverse("admin:gpuaas_dashboard"),
        reverse("admin:gpuaas_dashboard_data"),
        reverse("admin:billing_statement_changelist"),
        reverse("admin:monitoring_healthevent_changelist"),
    ]
    for url in pages:
        assert client.get(url).status_code == 403, url
    assert client.post(reverse("admin:capacity_take_offline"), {}).status_code == 403
    assert snapshot() == before


def test_the_approve_action_needs_the_approve_permission_not_just_change(client, staff_nobody, make_request, fleet):
    from django.contrib.auth.models import Permission

    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    request = make_request(count=1)
    grants = Permission.objects.filter(codename__in=["view_poolrequest", "change_poolrequest"])
    staff_nobody.user_permissions.add(*grants)
    client.force_login(staff_nobody)
    changelist = reverse("admin:pools_poolrequest_changelist")
    page = client.get(changelist).content.decode()
    assert "approve_selected" not in page and "release_selected" in page
    before = snapshot()
    response = _action(client, changelist, "approve_selected", [request.pk], apply="1", reason="ok")
    assert response.status_code == 302  # Django: "No action selected" (it is not offered to them)
    assert snapshot() == before


def test_the_operators_group_may_approve_in_the_admin(client, staff_operator, make_request, fleet):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    request = make_request(count=1)
    client.force_login(staff_operator)
    changelist = reverse("admin:pools_poolrequest_changelist")
    response = _action(client, changelist, "approve_selected", [request.pk], apply="1", reason="ok")
    assert response.status_code == 302
    request.refresh_from_db()
    assert request.state != "submitted"
    transition = request.transitions.get(from_state="submitted")
    assert (transition.actor, transition.reason) == (staff_operator, "ok")
    for url in (reverse("admin:gpuaas_dashboard_data"), reverse("admin:capacity_capacity_plan")):
        assert client.get(url).status_code == 200, url


# --- Workflow fields are read-only in the admin --------------------------------------------------


def test_an_active_requests_count_cannot_be_edited_in_the_admin(client, operator, make_request, fleet):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]] * 4)
    request = make_request(count=2)
    services.approve(request, actor=operator)
    client.force_login(operator)
    url = reverse("admin:pools_poolrequest_change", args=[request.pk])
    page = client.get(url).content.decode()
    assert 'name="count"' not in page and 'name="state"' not in page
    transitions, state = PoolRequestTransition.objects.count(), request.state
    client.post(url, {"count": "7", "project": str(request.project_id), "state": "draft", "_save": "Save"})
    request.refresh_from_db()
    assert (request.count, request.state) == (2, state)
    assert PoolRequestTransition.objects.count() == transitions
    pool = request.pool
    pool_page = client.get(reverse("admin:pools_gpupool_change", args=[pool.pk])).content.decode()
    assert 'name="state"' not in pool_page and 'name="project"' not in pool_page and 'name="name"' not in pool_page


# --- The Operators group -------------------------------------------------------------------------


def test_operators_group_command_makes_operators(django_user_model, capsys):
    user = django_user_model.objects.create_user("olga", "o@example.com", "pw")
    assert not operator_can(user, "pools.approve_poolrequest")
    call_command("operators_group", "--add", "olga")
    user = django_user_model.objects.get(pk=user.pk)
    assert user.is_staff and user.groups.filter(name=OPERATORS_GROUP).exists()
    assert operator_can(user, "pools.approve_poolrequest", "capacity.force_migreconfiguration")
    assert sees_all_projects(user)
    assert not user.has_perm("auth.change_user")  # users and groups stay with superusers
    permissions = Group.objects.get(name=OPERATORS_GROUP).permissions.count()
    call_command("operators_group")  # idempotent
    assert Group.objects.get(name=OPERATORS_GROUP).permissions.count() == permissions


def test_operators_group_command_refuses_unknown_users_and_changes_nothing(django_user_model):
    from django.core.management.base import CommandError

    django_user_model.objects.create_user("olga", "o@example.com", "pw")
    with pytest.raises(CommandError, match="nobody"):
        call_command("operators_group", "--add", "olga", "nobody")
    assert not Group.objects.filter(name=OPERATORS_GROUP).exists()
    assert not django_user_model.objects.get(username="olga").is_staff


def test_an_inactive_or_non_staff_user_with_permissions_is_no_operator(django_user_model):
    from tenancy.roles import operators_group

    user = django_user_model.objects.create_user("pat", "p@example.com", "pw")
    user.groups.add(operators_group())
    assert not operator_can(user, "tenancy.view_project")
    user.is_staff, user.is_active = True, False
    assert not operator_can(user, "tenancy.view_project")
