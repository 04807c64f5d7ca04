"""A borrower's approval racing the loan machine on PostgreSQL: its loans end exactly once, and a loan is never
left open for a request that was approved (pools/services/ transition, pools/lending.py)."""

from __future__ import annotations

import datetime as dt
from unittest import mock

import pytest
from django.utils import timezone
from pool_world import run_concurrently

from pools import lending, services
from pools.choices import LoanState, RequestState
from pools.exceptions import LendingRefused
from pools.models import Allocation, GpuPool, Loan, PoolRequest
from scheduling import queue

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": ""}
APPROVED = "its own units were approved"


class NoPods:
    """The Kubernetes client reconcile_loans() reads, with nothing in it: no lender Pending, no pod to evict."""

    def __call__(self, cluster):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def list_pods(self, namespace: str = "", **_) -> list:
        return []

    def list_pods_on_node(self, node_name: str, namespace: str = "", **_) -> list:
        return []


@pytest.fixture
def setup(fleet, make_request, operator, other_project, charlie):
    """team-a holds one of two GPUs; team-b's one-GPU request is queued (the other GPU is free for its approval)."""
    node = fleet.full_node("t1", gpus=2)
    lender = services.approve(make_request(count=1, **FULL), actor=operator)
    GpuPool.objects.filter(pk=lender.pk).update(lending_enabled=True)  # lending is opt-in
    unit = Allocation.objects.active().get(pool=lender)
    borrower = make_request(count=1, wait_if_full=True, target=other_project, actor=charlie, **FULL)
    queue.enqueue(borrower)
    return node.cluster, unit, borrower


@pytest.fixture(autouse=True)
def no_kubernetes():
    """The borrower's grant is reconciled after commit by a worker: counted here, not run."""
    with (
        mock.patch("pools.tasks.reconcile_project_task.delay_on_commit") as enqueued,
        mock.patch.object(lending, "reconcile"),
    ):
        yield enqueued


@pytest.mark.parametrize("round_", range(3))
def test_approval_and_a_reclaim_pass_end_a_due_loan_exactly_once(setup, operator, other_project, round_):
    cluster, unit, borrower = setup
    loan = lending.lend(unit, other_project, request=borrower)
    assert lending.request_reclaim(loan, reason="the lender asked", at=timezone.now() - dt.timedelta(hours=1))
    outcomes = run_concurrently(
        [
            lambda: services.approve(PoolRequest.objects.get(pk=borrower.pk), actor=operator),
            lambda: lending.reconcile_loans(cluster, now=timezone.now(), client_factory=NoPods()),
        ]
    )
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    assert PoolRequest.objects.get(pk=borrower.pk).state == RequestState.PROVISIONING
    loan.refresh_from_db()
    assert loan.state == LoanState.ENDED
    ended_by_reclaim = outcomes[1]["ended"]
    ended_by_approval = loan.reason == APPROVED
    assert ended_by_reclaim + ended_by_approval == 1  # one of them, never both
    assert loan.reason in (APPROVED, "the lender asked")


@pytest.mark.parametrize("round_", range(3))
def test_a_lend_racing_the_approval_never_leaves_an_open_loan_for_an_approved_request(
    setup, operator, other_project, round_
):
    cluster, unit, borrower = setup

    def lend():
        try:
            return lending.lend(unit, other_project, request=PoolRequest.objects.get(pk=borrower.pk))
        except LendingRefused as exc:
            return exc

    def approve():
        return services.approve(PoolRequest.objects.get(pk=borrower.pk), actor=operator)

    outcomes = run_concurrently([lend, approve])
    assert not isinstance(outcomes[1], Exception), outcomes
    assert PoolRequest.objects.get(pk=borrower.pk).state == RequestState.PROVISIONING
    assert not Loan.objects.open().exists()
    if isinstance(outcomes[0], LendingRefused):  # the approval came first
        assert not Loan.objects.exists()
    else:  # the loan came first: the approval ended it
        assert Loan.objects.get().reason == APPROVED
