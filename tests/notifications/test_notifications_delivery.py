"""The outbox: after commit only, once per event and recipient, retried with backoff across a failing endpoint."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core import mail
from django.db import transaction
from django.utils import timezone
from notification_helpers import DELIVER_TASK, FAN_OUT_TASK, task_name

from notifications import services, tasks
from notifications.choices import DeliveryState, EventKind
from notifications.models import Delivery, Event
from pools import signals
from pools.models import PoolRequest

pytestmark = pytest.mark.django_db


def refuse(project, *, pk=None, fan_out=True):
    """Send pools.signals.request_refused as pools.services.transition does, for a stored request, and (as the
    fan-out task would after commit) write its deliveries."""
    request = PoolRequest.objects.get(pk=pk) if pk else PoolRequest.objects.create(project=project, name="r")
    signals.request_refused.send(sender=PoolRequest, request=request, actor=None, reason="no", at=timezone.now())
    if fan_out:
        services.fan_out(f"request_refused:{request.pk}")
    return request


def webhook_only(team):
    """Keep only the JSON webhook: no email recipients, no Slack hook."""
    from notifications.models import Preference

    for user in team["users"]:
        Preference.objects.create(user=user, project=team["project"], email=False)
    team["slack"].delete()


def test_nothing_is_enqueued_before_commit_and_nothing_at_all_after_a_rollback(
    team, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        request = refuse(team["project"], fan_out=False)
        assert (Event.objects.count(), Delivery.objects.count(), mail.outbox) == (1, 0, [])
    key = f"request_refused:{request.pk}"
    assert [(task_name(c), c.args) for c in callbacks] == [(FAN_OUT_TASK, (key,))]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.fan_out(key)
        assert services.fan_out(key) == []  # once
    assert [(task_name(c), c.args) for c in callbacks] == [
        (DELIVER_TASK, (pk,)) for pk in sorted(Delivery.objects.values_list("pk", flat=True))
    ]
    assert Delivery.objects.count() == 4 and mail.outbox == []

    Delivery.objects.all().delete()
    Event.objects.all().delete()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                refuse(team["project"], fan_out=False)
                raise RuntimeError("the change rolls back")
    assert (Event.objects.count(), Delivery.objects.count(), callbacks) == (0, 0, [])


def test_a_signal_sent_twice_is_recorded_and_delivered_once(team, receiver, sent):
    request = sent(lambda: refuse(team["project"], fan_out=False))
    sent(lambda: refuse(team["project"], pk=request.pk, fan_out=False))
    assert Event.objects.filter(kind=EventKind.REQUEST_REFUSED).count() == 1
    assert Delivery.objects.count() == 4
    assert len(mail.outbox) == 2
    assert len(receiver.at("/json")) == 1 and len(receiver.at("/slack")) == 1


def test_a_delivery_task_run_twice_sends_once(team, receiver, django_capture_on_commit_callbacks):
    webhook_only(team)
    refuse(team["project"])
    delivery = Delivery.objects.get()
    assert tasks.deliver_task.run(delivery.pk) == "sent"
    assert tasks.deliver_task.run(delivery.pk) == "skipped"
    assert len(receiver.at("/json")) == 1
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == (DeliveryState.SENT, 1, 200)


def test_a_claimed_delivery_is_not_sent_by_a_second_worker(team, receiver):
    webhook_only(team)
    refuse(team["project"])
    delivery = Delivery.objects.get()
    Delivery.objects.filter(pk=delivery.pk).update(lease_expires_at=timezone.now() + dt.timedelta(minutes=1))
    assert services.deliver(delivery.pk) == "skipped"
    assert receiver.received == []
    # A dead worker's lease runs out: the delivery is sent by the next try.
    assert services.deliver(delivery.pk, now=timezone.now() + dt.timedelta(minutes=2)) == "sent"


def test_a_failing_endpoint_is_retried_with_backoff_until_it_answers(team, receiver, sent, settings):
    webhook_only(team)
    receiver.script = [500, 503]  # then 200
    sent(lambda: refuse(team["project"], fan_out=False))
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.last_status) == (DeliveryState.SENT, 3, 200)
    assert len(receiver.at("/json")) == 3
    assert len({r.headers["X-Gpuaas-Delivery"] for r in receiver.received}) == 1  # the same delivery each time
    assert delivery.sent_at is not None


def test_retries_back_off_exponentially_with_jitter_up_to_a_cap(settings):
    settings.NOTIFY_RETRY_BACKOFF_S, settings.NOTIFY_RETRY_BACKOFF_MAX_S = 30, 600
    assert [services.backoff_s(n, rand=lambda: 0.0) for n in range(7)] == [15, 30, 60, 120, 240, 300, 300]
    assert [services.backoff_s(n, rand=lambda: 1.0) for n in range(7)] == [30, 60, 120, 240, 480, 600, 600]


def test_the_task_retries_a_transient_failure_after_the_backoff(team, receiver, monkeypatch, settings):
    webhook_only(team)
    refuse(team["project"])
    delivery = Delivery.objects.get()
    receiver.script = [500]
    asked = {}

    def retry(**kwargs):
        asked.update(kwargs)
        return RuntimeError("retry scheduled")

    monkeypatch.setattr(tasks.deliver_task, "retry", retry)
    monkeypatch.setattr(services, "backoff_s", lambda n: 42.0 + n)
    with pytest.raises(RuntimeError, match="retry scheduled"):
        tasks.deliver_task.run(delivery.pk)
    assert (asked["countdown"], asked["max_retries"], type(asked["exc"])) == (
        42.0,
        settings.NOTIFY_MAX_RETRIES,
        services.TransientDeliveryError,
    )


def test_an_endpoint_that_keeps_failing_is_given_up_after_the_last_retry(team, receiver, sent, settings):
    webhook_only(team)
    receiver.script = [500] * 20
    sent(lambda: refuse(team["project"], fan_out=False))
    delivery = Delivery.objects.get()
    tries = settings.NOTIFY_MAX_RETRIES + 1
    assert (delivery.state, delivery.attempts, delivery.last_status) == (DeliveryState.FAILED, tries, 500)
    assert delivery.last_error.startswith("HTTP 500")
    assert len(receiver.received) == tries


def test_a_client_error_is_not_retried(team, receiver, sent):
    webhook_only(team)
    receiver.script = [410]
    sent(lambda: refuse(team["project"], fan_out=False))
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.last_status) == (DeliveryState.FAILED, 1, 410)


def test_an_unreachable_endpoint_is_a_transient_failure(team, receiver):
    webhook_only(team)
    team["json"].url = "http://127.0.0.1:9/"  # discard port: nothing listens
    team["json"].save()
    refuse(team["project"])
    delivery = Delivery.objects.get()
    with pytest.raises(services.TransientDeliveryError):
        services.deliver(delivery.pk)
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == (DeliveryState.PENDING, 1, None)
    assert "ConnectionError" in delivery.last_error
    assert services.deliver(delivery.pk, final=True) == "failed"


def test_the_sweep_resends_pending_deliveries_nobody_tried(team, receiver, django_capture_on_commit_callbacks):
    webhook_only(team)
    refuse(team["project"])
    delivery = Delivery.objects.get()
    assert services.sweep() == []  # fresh: its own task is on its way
    later = timezone.now() + dt.timedelta(seconds=services.settings.NOTIFY_SWEEP_S + 1)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.sweep(now=later) == [delivery.pk]
    assert [(task_name(c), c.args) for c in callbacks] == [(DELIVER_TASK, (delivery.pk,))]


def test_an_operator_sends_failed_deliveries_again(team, receiver, sent):
    webhook_only(team)
    receiver.script = [410]
    sent(lambda: refuse(team["project"], fan_out=False))
    delivery = Delivery.objects.get()
    assert delivery.state == DeliveryState.FAILED
    assert sent(lambda: services.send_again([delivery.pk])) == 1
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == (DeliveryState.SENT, 2)
