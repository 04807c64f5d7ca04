"""Best-effort borrowing without a queued request (docs/queue.md, Borrowing): a member asks through the API, the
lending beat serves it from other projects' idle units after the queue, the lender reclaims after the grace
period, both statements say so, and the member ends it. Against the simulator (device plugin, "demo")."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone
from test_borrowers import flag_idle
from test_lending import NODE, create_pod, pod

from billing import services as billing
from billing.choices import LineType
from monitoring.services.lending import lend_idle
from pools import lending, services
from pools.choices import BestEffortState, LoanState
from pools.models import Allocation, BestEffortRequest, GpuPool, Loan
from pools.tasks import provision_pool_task, reconcile_project_task
from scheduling import queue

pytestmark = pytest.mark.django_db
H = dt.timedelta(hours=1)
URL = "/api/v1/best-effort-requests/"
ASK = {"isolation": "mig", "product": "H100-80GB", "profile_name": "3g.40gb", "count": 1}


@pytest.fixture
def lender(sim, make_request, operator):
    """team-a holds every 3g.40gb unit of one node (8), provisioned."""
    pool = services.approve(make_request(count=8), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    GpuPool.objects.filter(pk=pool.pk).update(lending_enabled=True)  # lending is opt-in
    units = list(Allocation.objects.active().filter(pool=pool).order_by("pk"))
    assert {u.gpu.node.name for u in units} == {NODE}
    return pool, units


def ask(api, user, project, **fields):
    return api(user).post(URL, {"project": project.pk, **ASK, **fields}, format="json")


def test_a_member_asks_and_sees_it_a_non_member_cannot(api, fleet, other_project, charlie, bob, victor, project):
    response = ask(api, charlie, other_project)
    assert response.status_code == 201, response.data
    made = BestEffortRequest.objects.get()
    assert response.data["id"] == made.pk
    assert (response.data["state"], response.data["units_held"], response.data["spec_kind"]) == ("open", 0, "mig")
    assert (made.project, made.requested_by, made.profile_name, made.until) == (other_project, charlie, "3g.40gb", None)
    assert [r["id"] for r in api(charlie).get(URL).data["results"]] == [made.pk]
    # Another project's best-effort request does not exist, to bob: 404, and he cannot ask in its name (400).
    assert api(bob).get(f"{URL}{made.pk}/").status_code == 404
    assert api(bob).post(f"{URL}{made.pk}/end/", {}, format="json").status_code == 404
    assert api(bob).get(URL).data["results"] == []
    refused = ask(api, bob, other_project)
    assert refused.data == {"project": [f'Invalid pk "{other_project.pk}" - object does not exist.']}
    # A viewer of team-a may not ask: 403; nothing was made.
    assert ask(api, victor, project).status_code == 403
    assert BestEffortRequest.objects.count() == 1
    assert api(None).get(URL).status_code in (401, 403)


def test_bad_input_is_a_400_with_field_messages(api, fleet, other_project, charlie):
    too_few = ask(api, charlie, other_project, count=0)
    assert too_few.data["count"] == ["Ensure this value is greater than or equal to 1."]
    past = (timezone.now() - H).isoformat()
    assert ask(api, charlie, other_project, until=past).data == {"until": ["The end must be in the future."]}
    assert set(ask(api, charlie, other_project, tier="gold").data) == {"tier"}
    assert set(ask(api, charlie, other_project, isolation="vgpu").data) == {"isolation"}
    assert ask(api, charlie, other_project, colour="red").status_code == 400  # unknown fields are refused
    assert not BestEffortRequest.objects.exists()


def test_served_after_the_queue_reclaimed_after_grace_and_both_statements_say_so(
    sim, lender, api, make_request, other_project, charlie, project, settings, django_capture_on_commit_callbacks
):
    settings.LENDING_RECLAIM_GRACE_S = 120
    pool, units = lender
    best_effort = BestEffortRequest.objects.get(pk=ask(api, charlie, other_project).data["id"])
    waiting = make_request(count=1, wait_if_full=True, target=other_project, actor=charlie)
    queue.enqueue(waiting)
    t0 = dt.datetime(2026, 3, 10, 10, 0, tzinfo=dt.UTC)
    flag_idle(units[0], t0)
    BestEffortRequest.objects.filter(pk=best_effort.pk).update(created_at=t0 - H)
    assert len(lend_idle(now=t0)) == 1
    assert Loan.objects.get().borrower_request == waiting  # the queue first
    flag_idle(units[1], t0)
    (made,) = lend_idle(now=t0)
    loan = Loan.objects.get(pk=made)
    assert (loan.best_effort, loan.borrower_request, loan.allocation) == (best_effort, None, units[1])
    assert lend_idle(now=t0) == []  # it has its count
    assert api(charlie).get(f"{URL}{best_effort.pk}/").data["units_held"] == 1
    # The borrower's pod runs on the lent node; the lender needs its units back.
    assert reconcile_project_task(other_project.pk, pool.cluster_id) is True
    create_pod(sim, "team-b", "borrower", borrowed=True)
    assert pod(sim, "team-b", "borrower")["status"]["phase"] == "Running"
    queue.cancel(waiting, actor=charlie, reason="not needed")  # its loan ends: one borrowed unit left on the node
    for i in range(8):
        create_pod(sim, "team-a", f"lender-{i}")
    cluster = sim.clusters["prod"]
    need = t0 + 2 * H - dt.timedelta(seconds=120)
    assert lending.reconcile_loans(cluster, now=need)["reclaiming"] == 1
    assert lending.reconcile_loans(cluster, now=t0 + 2 * H) == {"reclaiming": 0, "ended": 1, "evicted": 1}
    loan.refresh_from_db()
    assert (loan.state, loan.returned_at) == (LoanState.ENDED, t0 + 2 * H)
    assert pod(sim, "team-b", "borrower") is None
    best_effort.refresh_from_db()
    assert best_effort.state == BestEffortState.OPEN  # still asking: the next idle unit serves it again
    # Both statements say so: two hours at the best-effort rate, charged and credited.
    borrower = billing.generate_statement(other_project, t0.date().replace(day=1))
    lender_statement = billing.generate_statement(project, t0.date().replace(day=1))
    charge = borrower.lines.get(line_type=LineType.BORROWED, reason=f"loan #{loan.pk}")
    credit = lender_statement.lines.get(line_type=LineType.LENT_CREDIT, reason=f"loan #{loan.pk}")
    assert (charge.hours, credit.hours) == (Decimal(2), Decimal(2))
    assert charge.amount > 0 and credit.amount == -charge.amount
    assert "best-effort rate" in charge.description and "lent to team-b" in credit.description


def test_the_member_ends_it_and_its_units_go_back_now(lender, api, other_project, charlie):
    pool, units = lender
    best_effort = BestEffortRequest.objects.get(pk=ask(api, charlie, other_project).data["id"])
    now = timezone.now()
    flag_idle(units[0], now)
    (made,) = lend_idle(now=now)
    response = api(charlie).post(f"{URL}{best_effort.pk}/end/", {"reason": "done"}, format="json")
    assert response.status_code == 200
    assert (response.data["state"], response.data["units_held"], response.data["end_reason"]) == ("ended", 0, "done")
    loan = Loan.objects.get(pk=made)
    assert (loan.state, loan.reason) == (LoanState.ENDED, "done")
    assert api(charlie).post(f"{URL}{best_effort.pk}/end/", {}, format="json").status_code == 409
    assert lend_idle(now=now + H) == []  # an ended request is not served


def test_its_until_ends_it_at_the_next_lending_pass(lender, api, other_project, charlie):
    pool, units = lender
    until = timezone.now() + H
    best_effort = BestEffortRequest.objects.get(pk=ask(api, charlie, other_project, until=until.isoformat()).data["id"])
    flag_idle(units[0], until - H)
    (made,) = lend_idle(now=until - H)
    assert lend_idle(now=until) == []
    best_effort.refresh_from_db()
    assert (best_effort.state, best_effort.ended_at) == (BestEffortState.ENDED, until)
    assert Loan.objects.get(pk=made).returned_at == until


def test_own_units_are_never_lent_to_its_best_effort_request(lender, api, project, bob):
    pool, units = lender
    assert ask(api, bob, project).status_code == 201
    flag_idle(units[0], timezone.now())
    assert lend_idle() == []
