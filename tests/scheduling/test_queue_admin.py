"""The queue's admin pages: the waiting requests in order, the forecast's accuracy, the operator actions."""

import datetime as dt

import pytest
from django.urls import reverse

from pools import services
from pools.models import PoolRequest, QueueEntry
from scheduling import queue

pytestmark = pytest.mark.django_db

ENTRIES = reverse("admin:pools_queueentry_changelist")
REQUESTS = reverse("admin:pools_poolrequest_changelist")
FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": "", "wait_if_full": True}


@pytest.fixture
def waiting(fleet, make_request, operator):
    fleet.full_node("t1", gpus=1)
    services.approve(make_request(count=1, **FULL), actor=operator)
    requests = [make_request(count=1, **FULL) for _ in range(2)]
    for request in requests:
        queue.enqueue(request)
    return requests


def test_the_queue_page_lists_places_and_the_forecast_accuracy(client, operator, waiting):
    done = PoolRequest.objects.filter(state="provisioning").get()
    QueueEntry.objects.create(
        request=done, queued_at=done.created_at, first_p50=done.approved_at, first_p90=done.approved_at
    )
    client.force_login(operator)
    page = client.get(ENTRIES)
    assert page.status_code == 200
    assert "forecast accuracy over 1 started" in page.content.decode()
    flagged = client.get(REQUESTS, {"queue": "approvable"})
    assert list(flagged.context["cl"].result_list) == []


def test_the_queue_page_says_what_orders_each_entry(client, operator, waiting, settings):
    settings.QUEUE_AGED_AFTER_H = 1
    old = QueueEntry.objects.get(request=waiting[0])
    QueueEntry.objects.filter(pk=old.pk).update(queued_at=old.queued_at - dt.timedelta(hours=2))
    client.force_login(operator)
    rows = client.get(ENTRIES).content.decode()
    assert rows.count('<td class="field-ordered_by">age</td>') == 1
    assert rows.count('<td class="field-ordered_by">fair share 0.0</td>') == 1


def test_hold_from_the_admin_asks_for_a_reason_then_holds(client, operator, waiting):
    client.force_login(operator)
    entry = QueueEntry.objects.get(request=waiting[0])
    selected = {"action": "hold_selected", "_selected_action": [entry.pk]}
    assert client.post(ENTRIES, selected).status_code == 200  # the reason page
    client.post(ENTRIES, {**selected, "apply": "1", "reason": "budget"})
    entry.refresh_from_db()
    assert entry.on_hold is True
