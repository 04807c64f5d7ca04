"""Notification tasks (queue "default"): thin wrappers around notifications.services, safe to run twice."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from . import services


@shared_task(
    bind=True,
    autoretry_for=(services.TransientDeliveryError,),
    retry_backoff=settings.NOTIFY_RETRY_BACKOFF_S,
    retry_backoff_max=settings.NOTIFY_RETRY_BACKOFF_MAX_S,
    retry_jitter=True,
    max_retries=settings.NOTIFY_MAX_RETRIES,
    time_limit=settings.NOTIFY_WEBHOOK_TIMEOUT_S * 3 + 30,
    soft_time_limit=settings.NOTIFY_WEBHOOK_TIMEOUT_S * 3 + 20,
)
def deliver_task(self, delivery_id: int) -> str:
    """Send one delivery (services.deliver); a transient failure is retried with exponential backoff,
    and the last retry marks it failed. A delivery already sent, failed or claimed is skipped."""
    return services.deliver(delivery_id, final=self.request.retries >= self.max_retries)


@shared_task
def announce_expiring_task() -> int:
    """Beat: announce pools whose end is within NOTIFY_EXPIRY_WINDOW_H (once per end date)."""
    return services.announce_expiring()


@shared_task
def operator_digest_task() -> bool:
    """Beat (hourly): the operators' digest, made once per NOTIFY_DIGEST_INTERVAL_H period."""
    return services.operator_digest() is not None


@shared_task
def sweep_deliveries_task() -> int:
    """Beat: re-enqueue pending deliveries whose message was lost."""
    return len(services.sweep())
