"""Which idle units are lent, and to whom: monitoring's idle flags meet the queue (monitoring/services/lending.py)."""

import datetime as dt

import pytest
from django.utils import timezone

from monitoring.models import IdleReservation
from monitoring.services.lending import lend_idle
from pools import services
from pools.choices import RequestState
from pools.models import Allocation, GpuPool, Loan
from scheduling import queue

pytestmark = pytest.mark.django_db
FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": ""}


@pytest.fixture
def idle_holder(fleet, make_request, operator):
    """team-a holds both GPUs of a node; one of them flagged idle (detected now, so idle for the 24 h window)."""
    fleet.full_node("t1", gpus=2)
    pool = services.approve(make_request(count=2, **FULL), actor=operator)
    GpuPool.objects.filter(pk=pool.pk).update(lending_enabled=True)  # lending is opt-in
    unit = Allocation.objects.active().filter(pool=pool).order_by("pk").first()
    now = timezone.now()
    IdleReservation.objects.create(
        allocation=unit,
        window_start=now - dt.timedelta(hours=24),
        window_end=now,
        sm_active_avg=1.0,
        coverage=1.0,
        proposal="release",
        detected_at=now,
    )
    return pool, unit


@pytest.fixture
def waiting(make_request, other_project, charlie):
    request = make_request(count=1, wait_if_full=True, target=other_project, actor=charlie, **FULL)
    queue.after_submit(request)
    assert request.state == RequestState.QUEUED
    return request


def test_an_idle_unit_is_lent_to_the_first_waiting_request_of_another_project_once(idle_holder, waiting):
    pool, unit = idle_holder
    made = lend_idle()
    loan = Loan.objects.get()
    assert made == [loan.pk]
    assert (loan.allocation, loan.lender_pool, loan.borrower_id, loan.borrower_request) == (
        unit,
        pool,
        waiting.project_id,
        waiting,
    )
    assert lend_idle() == []  # idempotent: the unit is lent, the request has what it asked for


def test_a_unit_not_idle_long_enough_or_of_a_pool_that_opted_out_is_not_lent(idle_holder, waiting, settings):
    pool, unit = idle_holder
    settings.LENDING_IDLE_H = 48  # the flag shows 24 h of idleness
    assert lend_idle() == []
    settings.LENDING_IDLE_H = 24
    pool.lending_enabled = False
    pool.save(update_fields=["lending_enabled"])
    assert lend_idle() == []
    assert not Loan.objects.exists()


def test_a_unit_is_never_lent_to_its_own_project(idle_holder, make_request):
    own = make_request(count=1, wait_if_full=True, **FULL)
    queue.after_submit(own)
    assert own.state == RequestState.QUEUED
    assert lend_idle() == []
