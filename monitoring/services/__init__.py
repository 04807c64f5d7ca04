"""Write-side services of the monitoring app (one module per concern).

ingest     bulk insert-or-ignore of samples, series ids
collect    NVML node polls and DCGM scrapes -> samples, health, share checks
rollups    5-minute and hourly rollups
retention  batched deletion of old samples and rollups
health     health events and GpuCapacity.health
idle       idle reservations and their one-step release
timeslice  time-sliced pods above their memory share, eviction
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.utils import timezone

from monitoring.models import MaintenanceRun

logger = logging.getLogger(__name__)


def run_tracked(job: str, fn: Callable[[], dict], *, task_id: str = "") -> MaintenanceRun:
    """Run a periodic job and record it in MaintenanceRun (status, timing, result or error).

    The error is recorded and re-raised, so the worker logs it too.
    """
    run = MaintenanceRun.objects.create(job=job, task_id=task_id or "")
    try:
        result = fn()
    except Exception as exc:
        MaintenanceRun.objects.filter(pk=run.pk).update(
            status=MaintenanceRun.Status.FAILED, finished_at=timezone.now(), error=f"{type(exc).__name__}: {exc}"
        )
        raise
    MaintenanceRun.objects.filter(pk=run.pk).update(
        status=MaintenanceRun.Status.SUCCEEDED, finished_at=timezone.now(), result=result
    )
    run.refresh_from_db()
    return run
