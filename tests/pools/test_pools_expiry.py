"""Expiry: a notice first, release after the notice period and the end; idempotent; beat entry present."""

import datetime as dt

import pytest
from django.conf import settings
from django.utils import timezone

from pools import services
from pools.models import Allocation, PoolRequest
from pools.tasks import expire_requests_task

pytestmark = pytest.mark.django_db
HOUR = dt.timedelta(hours=1)


@pytest.fixture
def held(fleet, make_request, operator):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    now = timezone.now()
    request = make_request(count=1, end_at=now + 3 * HOUR)
    services.approve(request, actor=operator)
    return PoolRequest.objects.get(pk=request.pk)


def test_notice_then_expiry(held, django_capture_on_commit_callbacks):
    end = held.end_at
    assert services.expire_due(now=end - 2 * HOUR, notice_s=3600) == {"noticed": 0, "expired": 0}
    assert services.expire_due(now=end - HOUR, notice_s=3600) == {"noticed": 1, "expired": 0}
    assert services.expire_due(now=end - HOUR / 2, notice_s=3600) == {"noticed": 0, "expired": 0}
    held.refresh_from_db()
    assert held.expiry_notice_at == end - HOUR
    notice = held.transitions.last()
    assert (notice.from_state, notice.to_state, notice.actor) == ("provisioning", "provisioning", None)
    assert notice.reason.startswith(f"expiry notice: ends {end:%Y-%m-%d %H:%M} UTC")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.expire_due(now=end, notice_s=3600) == {"noticed": 0, "expired": 1}
    held.refresh_from_db()
    assert held.state == "expired"
    assert not Allocation.objects.active().exists()
    assert Allocation.objects.get().released_at is not None
    assert [cb.func.__self__.name for cb in callbacks] == [
        "pools.tasks.deprovision_pool_task",
        "pools.tasks.process_queue_task",  # freed units go to the queue
    ]
    assert services.expire_due(now=end + HOUR, notice_s=3600) == {"noticed": 0, "expired": 0}


def test_a_late_notice_still_gives_the_full_period(held):
    end = held.end_at
    assert services.expire_due(now=end + HOUR, notice_s=3600) == {"noticed": 1, "expired": 0}
    assert services.expire_due(now=end + HOUR + HOUR / 2, notice_s=3600) == {"noticed": 0, "expired": 0}
    assert services.expire_due(now=end + 2 * HOUR, notice_s=3600) == {"noticed": 0, "expired": 1}


def test_open_ended_and_released_requests_never_expire(fleet, make_request, operator, alice):
    fleet.mig_node("n1", [["3g.40gb", "3g.40gb"]])
    open_ended = make_request(count=1)
    services.approve(open_ended, actor=operator)
    gone = make_request(count=1, end_at=timezone.now() + HOUR)
    services.approve(gone, actor=operator)
    services.release(gone, actor=alice)
    assert services.expire_due(now=timezone.now() + 1000 * HOUR, notice_s=0) == {"noticed": 0, "expired": 0}


def test_the_beat_task_and_its_schedule(held):
    entry = settings.CELERY_BEAT_SCHEDULE["pools-expire-requests"]
    assert entry["task"] == "pools.tasks.expire_requests_task"
    assert entry["options"]["expires"] == entry["schedule"].total_seconds()
    assert settings.POOL_EXPIRY_NOTICE_S == 3600
    assert expire_requests_task() == {"noticed": 0, "expired": 0, "cleanups_enqueued": 0}
