"""`bench queue`'s replay on a hand-built month whose answer is known (benchmarks/queueing/__init__.py).

One node of 8 GPUs. Project 0 takes all 8 at hour 0 for 100 hours and sits idle; its need comes back
at hour 30. Project 1 asks for one GPU at hour 1 and has 10 hours of work.
"""

import datetime as dt

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from benchmarks.queueing import START, Arrival, replay
from pools.choices import LoanState, RequestState
from pools.models import Loan, PoolRequest

pytestmark = pytest.mark.django_db

H = dt.timedelta(hours=1)
LENDER = Arrival(START, 0, "inference", 8, 100.0, False, 0.02, need_back_h=30.0, busy_activity=0.5)
BORROWER = Arrival(START + H, 1, "development", 1, 10.0, False, 0.25)


def test_without_borrowing_the_request_waits_for_the_lenders_release():
    result = replay([LENDER, BORROWER], gpus=8, days=5, policy="queue")
    assert result["mean_wait_h"] == 49.5  # (0 + 99) / 2
    assert result["lender_reclaim_p99_s"] is None
    assert not Loan.objects.exists()


def test_with_borrowing_the_request_starts_on_the_idle_units_and_the_lender_gets_them_back(settings):
    settings.LENDING_RECLAIM_GRACE_S, settings.LENDING_RECONCILE_INTERVAL_S = 120, 30
    result = replay([LENDER, BORROWER], gpus=8, days=5, policy="queue+borrowing")
    # Flagged idle at hour 24 (the detector's 24 h window), lent at the lending beat then: a wait of 23 h.
    assert result["mean_wait_h"] == 11.5
    assert result["started_on_borrowed_units"] == 1
    loan = Loan.objects.get()
    assert loan.started_at == START + 24 * H
    # The need at hour 30 meets a reconcile tick: reclaim requested then, the unit back after the grace.
    assert (loan.state, loan.reclaim_requested_at) == (LoanState.ENDED, START + 30 * H)
    assert loan.returned_at == START + 30 * H + dt.timedelta(seconds=120)
    assert result["lender_reclaim_p99_s"] == 120.0
    assert result["loans_reclaimed"] == 1
    # It ran on the lent unit until the unit was back (6 h and the grace, at 25% SM), then on its own unit
    # from the lender's release for the rest of its 10 hours.
    assert result["borrowed_active_gpu_h"] == round((6 + 120 / 3600) * 0.25, 1)
    borrower = PoolRequest.objects.get(project__slug="p1")
    assert borrower.state == RequestState.RELEASED
    assert borrower.approved_at == START + 100 * H
    assert borrower.pool.released_at == START + 104 * H - dt.timedelta(seconds=120)


def test_the_borrowers_own_approval_ends_its_loan_in_the_product():
    """Project 2 holds the eighth GPU for 30 hours: at its release the queue approves the borrower, running on a
    lent unit since hour 24; the approval itself ends the loan (the replay no longer does)."""
    lender = Arrival(START, 0, "inference", 7, 100.0, False, 0.02)
    holder = Arrival(START, 2, "inference", 1, 30.0, True, 0.5)
    result = replay([lender, holder, BORROWER], gpus=8, days=3, policy="queue+borrowing")
    loan = Loan.objects.get()
    assert (loan.started_at, loan.returned_at) == (START + 24 * H, START + 30 * H)
    assert (loan.state, loan.reason) == (LoanState.ENDED, "its own units were approved")
    borrower = PoolRequest.objects.get(project__slug="p1")
    assert borrower.approved_at == START + 30 * H
    assert borrower.queue_entry.first_on_loan_at == START + 24 * H
    assert borrower.queue_entry.running_on_loan_since is None
    assert result["started_on_borrowed_units"] == 1


def test_a_need_between_reconcile_ticks_waits_for_the_next_tick():
    lender = Arrival(START, 0, "inference", 8, 100.0, False, 0.02, need_back_h=30.0 + 10 / 3600)
    result = replay([lender, BORROWER], gpus=8, days=2, policy="queue+borrowing")
    assert result["lender_reclaim_p99_s"] == 140.0  # 20 s to the next 30 s tick, then the 120 s grace


def test_an_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(CommandError, match="unknown fifo; choose among refuse, queue, queue\\+borrowing"):
        call_command("bench", "queue", "--policies", "queue,fifo", "--gpus", "8", "--days", "1")


def test_forecast_bounds_score_the_first_forecast_again_with_part_of_the_future_known():
    """Project 0 holds the node for 20 hours, with no end date and no hold history: the forecast draws its
    release at the default hold (24 h). Project 1's one-GPU request, queued at hour 1, starts at hour 20."""
    holder = Arrival(START, 0, "inference", 8, 20.0, False, 0.5)
    waiting = Arrival(START + H, 1, "inference", 1, 5.0, False, 0.5)
    result = replay([holder, waiting], gpus=8, days=2, policy="queue", bounds=True)
    assert result["mean_wait_h"] == 9.5  # (0 + 19) / 2
    as_drawn = round(4 / 19, 3)  # predicted hour 24, started at hour 20, after a wait of 19 hours
    assert result["forecast_mae_ratio"] == as_drawn
    assert result["forecast_bounds"] == {
        "scored": 1,
        "draws": 50,
        "as_drawn": {"mae_ratio": as_drawn, "within_p90": 1.0},
        "exact_holds": {"mae_ratio": 0.0, "within_p90": 1.0},  # the holder's real release: exact
        "exact_arrivals": {"mae_ratio": as_drawn, "within_p90": 1.0},  # nothing arrived after it
        "exact_both": {"mae_ratio": 0.0, "within_p90": 1.0},
    }
