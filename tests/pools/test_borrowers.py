"""A borrower in the product's bookkeeping, against the simulator (device plugin, scenario "demo"): a queued
request running on lent units is shown as such, and its loans end when its own units are approved, whatever
approves them (docs/queue.md, Borrowing)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from unittest import mock

import pytest
from celery.exceptions import Retry
from django.urls import reverse
from django.utils import timezone
from pool_world import kube_for
from test_lending import MIG, NODE, create_pod, pod

from billing import services as billing
from billing.choices import LineType
from capacity.adapters.kubernetes import KubernetesError, NotFound
from monitoring.models import IdleReservation
from monitoring.services.lending import lend_idle
from pools import lending, services
from pools.choices import LoanState, RequestState
from pools.exceptions import LendingRefused
from pools.models import Allocation, AutoApprovalPolicy, GpuPool, Loan, PoolRequest, QueueEntry
from pools.provisioning import BORROWED_QUOTA
from pools.tasks import evict_returned_loans_task, provision_pool_task, reconcile_project_task
from scheduling import queue

pytestmark = pytest.mark.django_db
H = dt.timedelta(hours=1)


def flag_idle(unit: Allocation, at: dt.datetime) -> None:
    """The idle detector's flag on `unit`, detected at `at` (so idle for the whole LENDING_IDLE_H window)."""
    IdleReservation.objects.create(
        allocation=unit,
        window_start=at - 24 * H,
        window_end=at,
        sm_active_avg=1.0,
        coverage=1.0,
        proposal="release",
        detected_at=at,
    )


@pytest.fixture
def lender(sim, make_request, operator):
    """team-a holds every 3g.40gb unit of one node (8), provisioned; its first unit is flagged idle."""
    pool = services.approve(make_request(count=8), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    GpuPool.objects.filter(pk=pool.pk).update(lending_enabled=True)  # lending is opt-in
    units = list(Allocation.objects.active().filter(pool=pool).order_by("pk"))
    assert {u.gpu.node.name for u in units} == {NODE}
    return pool, units


@pytest.fixture
def borrower(make_request, other_project, charlie):
    """team-b's one-unit 3g.40gb request, queued (it would fit elsewhere: the queue is entered directly)."""
    request = make_request(count=1, wait_if_full=True, target=other_project, actor=charlie)
    queue.enqueue(request)
    return request


def lend_now(units, at, django_capture_on_commit_callbacks) -> list[int]:
    """lend_idle() on the flagged first unit; the borrower's reconcile it enqueues after commit is run here."""
    flag_idle(units[0], at)
    with django_capture_on_commit_callbacks() as callbacks:
        made = lend_idle(now=at)
    assert len(callbacks) == len(made)
    for loan in Loan.objects.filter(pk__in=made):
        assert reconcile_project_task(loan.borrower_id, loan.lender_pool.cluster_id) is True
    return made


def entry_of(request: PoolRequest) -> QueueEntry:
    return QueueEntry.objects.get(request=request)


def test_a_queued_request_covered_by_lent_units_is_shown_running_on_them(
    lender, borrower, charlie, api, django_capture_on_commit_callbacks
):
    pool, units = lender
    now = timezone.now()
    (loan_id,) = lend_now(units, now, django_capture_on_commit_callbacks)
    assert Loan.objects.get(pk=loan_id).borrower_request == borrower
    entry = entry_of(borrower)
    assert (entry.running_on_loan_since, entry.first_on_loan_at) == (now, now)
    shown = api(charlie).get(f"/api/v1/pool-requests/{borrower.pk}/").data
    assert shown["state"] == "queued"
    assert dt.datetime.fromisoformat(shown["queue"]["running_on_loan_since"]) == now
    (waiting,) = api(charlie).get("/api/v1/pool-requests/queue/").data
    assert waiting["queue"]["running_on_loan_since"] == shown["queue"]["running_on_loan_since"]
    assert lend_idle(now=now + H) == []  # idempotent: the first time stays
    assert entry_of(borrower).running_on_loan_since == now


def test_lent_units_short_of_the_count_are_not_running_on_loan(
    lender, make_request, other_project, charlie, django_capture_on_commit_callbacks
):
    pool, units = lender
    two = make_request(count=2, wait_if_full=True, target=other_project, actor=charlie)
    queue.enqueue(two)
    lend_now(units, timezone.now(), django_capture_on_commit_callbacks)
    assert Loan.objects.get().borrower_request == two
    assert (entry_of(two).running_on_loan_since, entry_of(two).first_on_loan_at) == (None, None)


def test_the_reclaim_ends_the_run_on_loan_only_when_the_loan_ends(
    sim, lender, borrower, settings, django_capture_on_commit_callbacks
):
    settings.LENDING_RECLAIM_GRACE_S = 120
    pool, units = lender
    t0 = timezone.now()
    lend_now(units, t0, django_capture_on_commit_callbacks)
    create_pod(sim, "team-b", "borrower", borrowed=True)
    for i in range(8):
        create_pod(sim, "team-a", f"lender-{i}")
    cluster = sim.clusters["prod"]
    assert lending.reconcile_loans(cluster, now=t0 + H)["reclaiming"] == 1
    assert entry_of(borrower).running_on_loan_since == t0  # its pods still run in the grace period
    assert lending.reconcile_loans(cluster, now=t0 + H + dt.timedelta(seconds=120))["ended"] == 1
    entry = entry_of(borrower)
    assert (entry.running_on_loan_since, entry.first_on_loan_at) == (None, t0)
    assert pod(sim, "team-b", "borrower") is None


def _approve_by_operator(request, operator, api):
    response = api(operator).post(f"/api/v1/pool-requests/{request.pk}/approve/", {}, format="json")
    assert response.status_code == 200, response.data


def _approve_by_policy(request, operator, api):
    AutoApprovalPolicy.objects.create(name="any")
    assert queue.process().approved == [request.pk]


def _approve_remembered(request, operator, api):
    """An operator approved it while capacity was short: the queue pass approves it in their name."""
    entry = QueueEntry.objects.filter(request=request)
    entry.update(operator_approved_at=timezone.now(), operator_approved_by=operator)
    assert queue.process().approved == [request.pk]


@pytest.mark.parametrize("approve", [_approve_by_operator, _approve_by_policy, _approve_remembered])
def test_approval_of_its_own_units_ends_its_loans_and_shrinks_its_borrowed_grant(
    sim, lender, borrower, operator, api, other_project, approve, django_capture_on_commit_callbacks
):
    pool, units = lender
    lend_now(units, timezone.now() - H, django_capture_on_commit_callbacks)
    cluster = sim.clusters["prod"]
    with kube_for(cluster) as kube:
        assert kube.get_resource_quota("team-b", BORROWED_QUOTA)["spec"]["hard"][f"requests.{MIG}"] == "1"
    with mock.patch("pools.tasks.reconcile_project_task.delay_on_commit") as enqueued:
        approve(borrower, operator, api)
    borrower.refresh_from_db()
    assert borrower.state == RequestState.PROVISIONING
    loan = Loan.objects.get()
    # Ended in the approval's transaction, at its instant: the lender is credited, the borrower billed, up to it.
    assert (loan.state, loan.returned_at, loan.reason) == (
        LoanState.ENDED,
        borrower.approved_at,
        "its own units were approved",
    )
    entry = entry_of(borrower)
    assert entry.running_on_loan_since is None and entry.first_on_loan_at is not None
    enqueued.assert_called_once_with(other_project.pk, pool.cluster_id)  # the borrower's grant, after commit
    assert reconcile_project_task(other_project.pk, pool.cluster_id) is True  # as the worker runs it
    with kube_for(cluster) as kube:
        with pytest.raises(NotFound):
            kube.get_resource_quota("team-b", BORROWED_QUOTA)
    assert lending.end_request_loans(borrower, reason="again") == 0  # once: nothing open is left
    assert Loan.objects.get().reason == "its own units were approved"


def test_a_request_leaving_the_queue_otherwise_ends_its_loans_with_the_reason(
    lender, borrower, operator, django_capture_on_commit_callbacks
):
    pool, units = lender
    lend_now(units, timezone.now(), django_capture_on_commit_callbacks)
    queue.cancel(borrower, actor=operator, reason="duplicate")
    loan = Loan.objects.get()
    assert (loan.state, loan.reason) == (LoanState.ENDED, "its request left the queue (rejected)")


def test_a_loan_for_a_request_no_longer_queued_is_refused(lender, borrower, other_project, operator):
    pool, units = lender
    services.approve(borrower, actor=operator)
    with pytest.raises(LendingRefused, match="not waiting in the queue"):
        lending.lend(units[0], other_project, request=borrower)
    assert not Loan.objects.exists()


def test_the_borrower_is_billed_and_the_lender_credited_only_until_the_approval(
    lender, borrower, operator, project, other_project
):
    pool, units = lender
    t0 = dt.datetime(2026, 3, 10, 10, 0, tzinfo=dt.UTC)
    flag_idle(units[0], t0)
    (made,) = lend_idle(now=t0)
    with mock.patch("django.utils.timezone.now", return_value=t0 + 3 * H):
        services.approve(borrower, actor=operator)
    assert Loan.objects.get(pk=made).returned_at == t0 + 3 * H
    march = dt.date(2026, 3, 1)
    charge = billing.generate_statement(other_project, march).lines.get(line_type=LineType.BORROWED)
    credit = billing.generate_statement(project, march).lines.get(line_type=LineType.LENT_CREDIT)
    assert (charge.hours, credit.hours, credit.amount) == (Decimal(3), Decimal(3), -charge.amount)


def test_the_admin_queue_filters_requests_running_on_lent_units(
    client, staff_operator, lender, borrower, django_capture_on_commit_callbacks
):
    pool, units = lender
    lend_now(units, timezone.now(), django_capture_on_commit_callbacks)
    client.force_login(staff_operator)
    url = reverse("admin:pools_queueentry_changelist")
    assert list(client.get(url, {"on_loan": "yes"}).context["cl"].result_list) == [entry_of(borrower)]
    assert list(client.get(url, {"on_loan": "no"}).context["cl"].result_list) == []
    assert client.get(reverse("admin:pools_besteffortrequest_changelist")).status_code == 200
    assert client.get(reverse("admin:pools_loan_changelist")).status_code == 200


def _cancel(request, operator):
    queue.cancel(request, actor=operator, reason="duplicate")


def _approve(request, operator):
    services.approve(request, actor=operator)


@pytest.mark.parametrize("leave", [_cancel, _approve])
def test_a_loan_ended_without_a_reclaim_takes_the_borrowers_pods_off_the_lenders_unit(
    sim, lender, borrower, operator, leave, django_capture_on_commit_callbacks
):
    """However a loan ends (here its request leaves the queue, approved or cancelled), the borrower's low-priority
    pods do not stay on the lender's unit: the lender's next need would find no loan to reclaim."""
    pool, units = lender
    lend_now(units, timezone.now() - H, django_capture_on_commit_callbacks)
    create_pod(sim, "team-b", "borrower", borrowed=True)
    assert pod(sim, "team-b", "borrower")["status"]["phase"] == "Running"
    loan = Loan.objects.get()
    with mock.patch("pools.tasks.evict_returned_loans_task.delay_on_commit") as enqueued:
        leave(borrower, operator)
    enqueued.assert_called_once_with([loan.pk])
    assert evict_returned_loans_task([loan.pk]) == 1  # as the worker runs it
    assert pod(sim, "team-b", "borrower") is None
    loan.refresh_from_db()
    assert (loan.state, loan.evicted_pods) == (LoanState.ENDED, ["borrower"])
    assert evict_returned_loans_task([loan.pk]) == 0  # idempotent: nothing left


def test_only_the_pods_beyond_the_borrowers_other_open_loans_on_the_node_are_evicted(
    sim, lender, borrower, other_project, django_capture_on_commit_callbacks
):
    pool, units = lender
    with django_capture_on_commit_callbacks():
        first = lending.lend(units[0], other_project, request=borrower)
        lending.lend(units[1], other_project)  # a second loan to team-b on the same node stays open
    assert reconcile_project_task(other_project.pk, pool.cluster_id) is True
    for name in ("b-0", "b-1"):
        create_pod(sim, "team-b", name, borrowed=True)
        assert pod(sim, "team-b", name)["status"]["phase"] == "Running"
    assert lending.end_loan(first, reason="done")
    assert evict_returned_loans_task([first.pk]) == 1
    assert [pod(sim, "team-b", n) is None for n in ("b-0", "b-1")] == [True, False]


def test_the_eviction_task_retries_when_the_cluster_cannot_be_reached():
    with mock.patch("pools.tasks.evict_returned", side_effect=KubernetesError("unreachable")):
        with pytest.raises(Retry):
            evict_returned_loans_task.apply(args=([1],), throw=True).get()
