"""Billing tasks (queue "billing"): thin wrappers around billing.services, safe to retry and to run twice."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import OperationalError
from django.utils import timezone

from core.leases import Heartbeat, lease_until

from . import recovery, services
from .choices import RunKind, RunStatus
from .models import BillingRun, MeteringWatermark, MonthNotEnded
from .periods import parse_period

logger = logging.getLogger(__name__)


@shared_task(
    bind=True,
    autoretry_for=(OperationalError,),
    retry_backoff=30,
    retry_backoff_max=600,
    max_retries=5,
)
def meter_usage_task(self) -> int:
    """Meter every complete hour up to now, catching up after downtime; returns hours metered.

    Idempotent: hours are claimed through the watermark and rows are unique per (allocation, hour).
    The run is recorded in BillingRun only when it metered something, so the table is not flooded
    by the frequent no-op passes. Holds the metering lease while it runs (billing.recovery): a run
    that finds it held by a live run returns 0; a dead run's lease lapses and the sweep re-enqueues.
    """
    started = timezone.now()
    token = recovery.run_token(self.request.id)
    services.watermark()
    if not recovery.claim_metering(token):
        return 0
    try:
        with Heartbeat(MeteringWatermark.objects.filter(pk=1, claimed_by=token)):
            result = services.meter_usage(now=started)
    finally:
        recovery.release_metering(token)
    if result.hours:
        BillingRun.objects.create(
            kind=RunKind.METER,
            status=RunStatus.SUCCEEDED,
            started_at=started,
            finished_at=timezone.now(),
            hours_metered=result.hours,
            records_written=result.records,
            metered_until=result.metered_until,
            task_id=self.request.id or "",
        )
    return result.hours


@shared_task(bind=True, autoretry_for=(OperationalError,), retry_backoff=60, max_retries=3)
def close_month_task(self, run_id: int | None = None, period: str | None = None) -> int:
    """Close a month: meter up to its end and make every project's draft statement.

    With `run_id` (an operator's request, or the sweep re-sending a close whose worker died) closes
    that run's month, unless the run is gone, done, or held by another live worker. From beat (no
    arguments) closes the previous month. Only a month that has ended is closed: for another the run
    is marked failed with the reason. The run's lease is renewed while it works (billing.recovery).
    Returns the number of statements.
    """
    token = recovery.run_token(self.request.id)
    if run_id is not None:
        run = BillingRun.objects.filter(pk=run_id, kind=RunKind.CLOSE).first()
        if run is None or run.status != RunStatus.RUNNING or not recovery.claim_close(run.pk, token):
            return 0
    else:
        month = parse_period(period) if period else services.previous_period()
        run = BillingRun.objects.create(
            kind=RunKind.CLOSE,
            period=month,
            task_id=self.request.id or "",
            claimed_by=token,
            lease_expires_at=lease_until(),
        )
    with Heartbeat(BillingRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING, claimed_by=token)):
        try:
            return len(services.close_month(run.period, run=run))
        except MonthNotEnded:
            logger.warning("billing run %s: %s has not ended; not closed", run.pk, f"{run.period:%Y-%m}")
            return 0  # recorded as failed in the run; retrying would not help


@shared_task
def sweep_billing_task() -> dict[str, int]:
    """Beat (every WORKFLOW_SWEEP_S): re-enqueue metering and month closes that no live worker holds."""
    return recovery.sweep()
