"""Celery tasks of the queue: thin; the work is in scheduling.queue.

Their names are those they had in pools.tasks (`name=`), which the beat schedule (gpuaas/settings/), redbeat's
entries and messages already queued carry: an upgrade leaves them working.
"""

from __future__ import annotations

from celery import shared_task

from . import queue


@shared_task(acks_late=True, name="pools.tasks.process_queue_task")
def process_queue_task() -> dict[str, list[int]]:
    """After units came free, and on the beat: approve or flag the queue's heads (scheduling/queue.py)."""
    result = queue.process()
    return {"approved": result.approved, "flagged": result.flagged}


@shared_task(acks_late=True, name="pools.tasks.refresh_forecasts_task")
def refresh_forecasts_task() -> int:
    """Beat (every QUEUE_FORECAST_INTERVAL_S): refresh every queued request's P50/P90 start."""
    return queue.refresh_forecasts()
