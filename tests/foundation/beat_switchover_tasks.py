"""The switchover test's tick, recorded twice in Redis: when a beat sends it and when the worker runs it.

Imported by the beats and the worker of test_beat_standby.py (beat_switchover_settings.CELERY_IMPORTS).
The send record names the beat process (its pid) and the time it sent; the run record is the task id.
"""

import json
import os
import time

import redis
from celery import shared_task
from celery.signals import before_task_publish
from django.conf import settings

SENT = "beat-switchover-test:sent"
RAN = "beat-switchover-test:ran"


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


@before_task_publish.connect
def record_send(sender=None, headers=None, **kwargs):
    if sender == settings.SWITCHOVER_TICK:
        _redis().rpush(SENT, json.dumps({"beat": os.getpid(), "at": time.time(), "id": headers["id"]}))


@shared_task(name=settings.SWITCHOVER_TICK, bind=True)
def switchover_tick(self):
    """Record that this tick ran (its id): a tick sent twice, or run twice, shows up in the list."""
    _redis().rpush(RAN, self.request.id)
