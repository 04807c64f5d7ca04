"""Borrowing idle reservations against the simulator (device plugin, scenario "demo"): a pool's unit is lent to
another project's queued request, the borrower's pod runs on it under the low PriorityClass, and when the lender
needs it back the borrower's pod is evicted after the grace period and the lender's pod runs (docs/queue.md)."""

from __future__ import annotations

import datetime as dt

import pytest
from pool_world import kube_for

from capacity.adapters.kubernetes import NotFound
from pools import lending, services
from pools.exceptions import LendingRefused
from pools.models import Allocation, GpuPool, Loan
from pools.provisioning import BORROWED_PRIORITY_CLASS, BORROWED_QUOTA, reconcile
from pools.tasks import provision_pool_task, reconcile_project_task

pytestmark = pytest.mark.django_db
MIG = "nvidia.com/mig-3g.40gb"
NODE = "prod-h100-bal-01"


def create_pod(sim, namespace: str, name: str, *, borrowed: bool = False) -> None:
    from simcluster.kube import ClusterApi

    spec = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {MIG: "1"}}}],
    }
    if borrowed:
        spec["priorityClassName"] = BORROWED_PRIORITY_CLASS
    cluster = sim.state.cluster("prod")
    with sim.state.lock:
        ClusterApi(cluster).create("pods", namespace, {"metadata": {"name": name}, "spec": spec})


def pod(sim, namespace: str, name: str) -> dict | None:
    record = sim.state.cluster("prod").pods.get((namespace, name))
    return None if record is None else record.obj


@pytest.fixture
def lent(sim, make_request, operator, project, other_project, django_capture_on_commit_callbacks):
    """team-a holds every 3g.40gb unit of one node (8); one of them is lent to team-b."""
    pool = services.approve(make_request(count=8), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    GpuPool.objects.filter(pk=pool.pk).update(lending_enabled=True)  # lending is opt-in
    units = list(Allocation.objects.active().filter(pool=pool).order_by("pk"))
    assert {u.gpu.node.name for u in units} == {NODE}
    with django_capture_on_commit_callbacks() as callbacks:
        loan = lending.lend(units[0], other_project)
    assert len(callbacks) == 1  # the borrower's reconcile, enqueued after commit; run here as the worker would
    assert reconcile_project_task(other_project.pk, pool.cluster_id) is True
    return pool, loan


def test_a_lent_unit_is_granted_to_the_borrower_under_the_low_priority_class(sim, lent, other_project):
    pool, loan = lent
    with kube_for(sim.clusters["prod"]) as kube:
        assert kube.get_resource_quota("team-b", BORROWED_QUOTA)["spec"]["hard"][f"requests.{MIG}"] == "1"
        node = {n.name: n for n in kube.list_nodes()}[NODE]
        assert node.labels[f"gpuaas.io/project-{other_project.pk}"] == "true"
    classes = sim.state.cluster("prod").priorityclasses
    assert classes[BORROWED_PRIORITY_CLASS].obj["value"] < 0
    create_pod(sim, "team-b", "borrower", borrowed=True)
    assert pod(sim, "team-b", "borrower")["spec"]["nodeName"] == NODE
    assert pod(sim, "team-b", "borrower")["status"]["phase"] == "Running"
    # The lender's allocation is untouched: its guarantee stands.
    assert Allocation.objects.active().filter(pool=pool).count() == 8


def test_the_lender_gets_its_unit_back_after_the_grace_period(sim, lent, settings):
    settings.LENDING_RECLAIM_GRACE_S = 120
    pool, loan = lent
    cluster = sim.clusters["prod"]
    create_pod(sim, "team-b", "borrower", borrowed=True)
    for i in range(8):
        create_pod(sim, "team-a", f"lender-{i}")
    pending = [i for i in range(8) if pod(sim, "team-a", f"lender-{i}")["status"]["phase"] == "Pending"]
    assert len(pending) == 1
    t0 = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)
    assert lending.reconcile_loans(cluster, now=t0) == {"reclaiming": 1, "ended": 0, "evicted": 0}
    loan.refresh_from_db()
    assert (loan.state, loan.reclaim_requested_at) == ("reclaiming", t0)
    with kube_for(cluster) as kube:  # no new borrowed pods from now on
        assert kube.get_resource_quota("team-b", BORROWED_QUOTA)["spec"]["hard"][f"requests.{MIG}"] == "0"
    # Within the grace period the borrower keeps running.
    assert lending.reconcile_loans(cluster, now=t0 + dt.timedelta(seconds=119))["evicted"] == 0
    assert pod(sim, "team-b", "borrower")["status"]["phase"] == "Running"
    result = lending.reconcile_loans(cluster, now=t0 + dt.timedelta(seconds=120))
    assert result == {"reclaiming": 0, "ended": 1, "evicted": 1}
    assert pod(sim, "team-b", "borrower") is None
    assert pod(sim, "team-a", f"lender-{pending[0]}")["status"]["phase"] == "Running"
    loan.refresh_from_db()
    assert (loan.state, loan.returned_at, loan.evicted_pods) == ("ended", t0 + dt.timedelta(seconds=120), ["borrower"])
    with kube_for(cluster) as kube:
        with pytest.raises(NotFound):
            kube.get_resource_quota("team-b", BORROWED_QUOTA)
    # Idempotent: a later pass finds nothing to do.
    assert lending.reconcile_loans(cluster, now=t0 + dt.timedelta(seconds=300)) == {
        "reclaiming": 0,
        "ended": 0,
        "evicted": 0,
    }


def test_the_lender_asks_and_a_released_lender_unit_ends_the_loan_at_once(sim, lent, operator):
    pool, loan = lent
    cluster = sim.clusters["prod"]
    t0 = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)
    assert lending.reclaim_pool(pool, at=t0) == 1
    assert lending.reclaim_pool(pool, at=t0) == 0  # already reclaiming
    loan.refresh_from_db()
    assert (loan.state, loan.reason) == ("reclaiming", "the lender asked")
    services.release(pool.request, actor=operator, reason="done")
    assert lending.reconcile_loans(cluster, now=t0 + dt.timedelta(seconds=1))["ended"] == 1
    loan.refresh_from_db()
    assert loan.state == "ended"


def test_opt_out_and_own_units_are_refused(sim, make_request, operator, project, other_project):
    pool = services.approve(make_request(count=2), actor=operator)
    provision_pool_task(pool.pk)
    unit = Allocation.objects.active().filter(pool=pool).first()
    with pytest.raises(LendingRefused):
        lending.lend(unit, project)
    pool.lending_enabled = False
    pool.save(update_fields=["lending_enabled"])
    unit.pool.refresh_from_db()
    with pytest.raises(LendingRefused):
        lending.lend(unit, other_project)
    assert not Loan.objects.exists()
    reconcile(other_project, pool.cluster)  # no loan: no borrowed quota, no priority class call needed
    with kube_for(sim.clusters["prod"]) as kube:
        with pytest.raises(NotFound):
            kube.get_resource_quota("team-b", BORROWED_QUOTA)


def test_only_the_lenders_admins_and_operators_toggle_lending(sim, make_request, operator, alice, bob, charlie, api):
    pool = services.approve(make_request(count=2), actor=operator)
    url = f"/api/v1/pools/{pool.pk}/lending/"
    assert pool.lending_enabled is False  # opt-in: a pool is its project's unless its admin says otherwise
    assert api(bob).post(url, {"lending_enabled": True}, format="json").status_code == 403  # member
    assert api(charlie).post(url, {"lending_enabled": True}, format="json").status_code == 404  # outsider
    pool.refresh_from_db()
    assert pool.lending_enabled is False  # nothing changed
    assert api(alice).post(url, {"lending_enabled": "maybe"}, format="json").status_code == 400
    # Schemathesis, 75 examples (issue #31): DRF's BooleanField took 0 and "yes" where the schema says boolean.
    for not_a_boolean in (0, 1, "true", "yes", None):
        response = api(alice).post(url, {"lending_enabled": not_a_boolean}, format="json")
        assert response.status_code == 400, not_a_boolean
        assert "lending_enabled" in response.json()
    pool.refresh_from_db()
    assert pool.lending_enabled is False
    response = api(alice).post(url, {"lending_enabled": True}, format="json")
    assert response.status_code == 200
    assert response.data["lending_enabled"] is True
    response = api(operator).post(url, {"lending_enabled": False}, format="json")
    assert (response.status_code, response.data["lending_enabled"]) == (200, False)


def test_opting_out_takes_lent_units_back(sim, lent):
    pool, loan = lent
    assert lending.set_lending(pool, False) is True
    loan.refresh_from_db()
    assert (loan.state, loan.reason) == ("reclaiming", "the lender opted out of lending")
    assert lending.set_lending(pool, False) is False


def test_admin_actions_toggle_lending_and_loans_are_read_only(
    client, staff_operator, staff_nobody, fleet, make_request, operator
):
    from django.contrib.admin import helpers
    from django.urls import reverse

    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    pool = services.approve(make_request(count=2), actor=operator)
    changelist = reverse("admin:pools_gpupool_changelist")
    action = {"action": "enable_lending", helpers.ACTION_CHECKBOX_NAME: [pool.pk]}
    client.force_login(staff_nobody)
    assert client.post(changelist, action).status_code == 403
    pool.refresh_from_db()
    assert pool.lending_enabled is False
    client.force_login(staff_operator)
    client.post(changelist, action, follow=True)
    pool.refresh_from_db()
    assert pool.lending_enabled is True
    action["action"] = "disable_lending"
    done = client.post(changelist, action, follow=True)
    assert [str(m) for m in done.context["messages"]] == ["1 pools no longer lend."]
    pool.refresh_from_db()
    assert pool.lending_enabled is False
    assert client.get(reverse("admin:pools_loan_changelist")).status_code == 200
    assert client.get(reverse("admin:pools_loan_add")).status_code == 403


def test_a_lent_unit_cannot_be_lent_again(sim, lent, django_user_model):
    from tenancy.models import Project

    pool, loan = lent
    third = Project.objects.create(name="Team C", slug="team-c", namespace="team-c")
    with pytest.raises(LendingRefused):
        lending.lend(loan.allocation, third)
    assert Loan.objects.count() == 1
