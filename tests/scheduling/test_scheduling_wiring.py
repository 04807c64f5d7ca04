"""The queue moved from pools to scheduling (#26): what is on the wire and what pools announces still reaches it."""

from __future__ import annotations

from unittest import mock

from django.conf import settings

from core.celery import app
from pools import services, signals
from scheduling.tasks import process_queue_task, refresh_forecasts_task


def test_the_queue_tasks_keep_the_names_queued_messages_and_the_beat_carry():
    assert process_queue_task.name == "pools.tasks.process_queue_task"
    assert refresh_forecasts_task.name == "pools.tasks.refresh_forecasts_task"
    beat = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"pools.tasks.process_queue_task", "pools.tasks.refresh_forecasts_task"} <= beat
    for name in ("pools.tasks.process_queue_task", "pools.tasks.refresh_forecasts_task"):
        assert app.tasks[name].run.__module__ == "scheduling.tasks"  # a worker runs the moved code by the old name


def test_units_coming_free_in_pools_start_a_queue_pass_after_commit():
    with mock.patch.object(process_queue_task, "delay_on_commit") as enqueued:
        services.enqueue_queue_processing()
    enqueued.assert_called_once_with()


def test_a_submission_pools_announces_is_answered_by_the_queue(make_request):
    request = make_request(state="submitted")
    with mock.patch("scheduling.queue.after_submit") as after_submit:
        signals.request_submitted.send(sender=type(request), request=request)
    after_submit.assert_called_once_with(request)
