"""The operators' digest (once per period, the events since the previous one) and the pool-expiry sweep."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core import mail
from django.utils import timezone

from notifications import services, tasks
from notifications.choices import EventKind
from notifications.models import Event
from pools import signals
from pools.models import PoolRequest

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 5, 6, 9, 30, tzinfo=dt.UTC)


def event_at(project, when):
    request = PoolRequest.objects.create(project=project, name="r")
    signals.request_refused.send(sender=PoolRequest, request=request, actor=None, reason="no", at=when)
    Event.objects.filter(key=f"request_refused:{request.pk}").update(created_at=when)


def test_one_digest_per_period_to_the_operators_only(team, operator, staff_operator, staff_nobody, sent, settings):
    settings.NOTIFY_DIGEST_INTERVAL_H = 24
    event_at(team["project"], NOW - dt.timedelta(days=1, hours=2))  # in the period the digest covers
    event_at(team["project"], NOW - dt.timedelta(hours=3))  # after the period's end: the next digest's
    mail.outbox.clear()
    digest = sent(lambda: services.operator_digest(now=NOW))
    assert digest.key == "operator_digest:2026-05-06T00:00Z"
    assert digest.payload["counts"] == {"Request refused": 1}
    assert sorted(m.to[0] for m in mail.outbox) == ["olga@example.com", "operator@example.com"]
    assert all(m.subject == "[gpuaas] gpuaas digest: 1 events to 2026-05-06 00:00 UTC" for m in mail.outbox)
    assert sent(lambda: services.operator_digest(now=NOW + dt.timedelta(hours=5))) is None  # same period
    assert len(mail.outbox) == 2

    mail.outbox.clear()
    following = sent(lambda: services.operator_digest(now=NOW + dt.timedelta(days=1)))
    assert following.payload["start"] == "2026-05-06T00:00:00+00:00"
    assert following.payload["counts"] == {"Request refused": 1}  # the later one only, not the first again
    assert len(mail.outbox) == 2


def test_a_period_without_events_mails_no_one(operator, sent):
    assert sent(lambda: services.operator_digest(now=NOW)).kind == EventKind.OPERATOR_DIGEST
    assert mail.outbox == []


def test_the_beat_task_makes_the_digest_once(operator, team):
    assert tasks.operator_digest_task.run() is True
    assert tasks.operator_digest_task.run() is False


def test_a_pool_is_announced_once_per_end_date_inside_the_window(team, sent, settings):
    settings.NOTIFY_EXPIRY_WINDOW_H = 24
    now = timezone.now()
    soon = PoolRequest.objects.create(
        project=team["project"], name="soon", state="active", end_at=now + dt.timedelta(hours=5)
    )
    PoolRequest.objects.create(project=team["project"], name="later", state="active", end_at=now + dt.timedelta(days=3))
    PoolRequest.objects.create(
        project=team["project"], name="gone", state="released", end_at=now + dt.timedelta(hours=1)
    )
    assert sent(lambda: services.announce_expiring(now=now)) == 1
    assert sent(lambda: services.announce_expiring(now=now + dt.timedelta(minutes=5))) == 0
    assert len(mail.outbox) == 2
    # Extended past the window, then nearing its new end: announced again, for the new end.
    PoolRequest.objects.filter(pk=soon.pk).update(end_at=now + dt.timedelta(days=2))
    assert sent(lambda: services.announce_expiring(now=now + dt.timedelta(days=1, hours=12))) == 1
    assert Event.objects.filter(kind=EventKind.POOL_EXPIRING, payload__request=soon.pk).count() == 2
