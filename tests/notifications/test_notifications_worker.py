"""A real worker on a real broker (Redis): a delivery whose endpoint fails twice is retried after its backoff
and sent once."""

from __future__ import annotations

import time

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import transaction
from django.utils import timezone

from core.celery import app
from notifications.choices import DeliveryState
from notifications.models import Delivery, Preference
from pools import signals
from pools.models import PoolRequest

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def wait_for(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_a_failing_webhook_is_retried_by_a_real_worker_and_sent_once(team, receiver, settings):
    settings.NOTIFY_RETRY_BACKOFF_S, settings.NOTIFY_RETRY_BACKOFF_MAX_S = 1, 2
    for user in team["users"]:
        Preference.objects.create(user=user, project=team["project"], email=False)
    team["slack"].delete()
    receiver.script = [500, 502]
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("default")
    with start_worker(app, pool="solo", perform_ping_check=False, queues=["default"], shutdown_timeout=10):
        with transaction.atomic():
            request = PoolRequest.objects.create(project=team["project"], name="r")
            signals.request_refused.send(
                sender=PoolRequest, request=request, actor=None, reason="no", at=timezone.now()
            )
        assert wait_for(lambda: Delivery.objects.filter(state=DeliveryState.SENT).exists())
    delivery = Delivery.objects.get()
    assert (delivery.attempts, delivery.last_status) == (3, 200)
    assert len(receiver.received) == 3
    assert len({r.headers["X-Gpuaas-Delivery"] for r in receiver.received}) == 1
