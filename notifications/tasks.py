"""Notification tasks (queue "default"): thin wrappers around notifications.services, safe to run twice."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from . import services


@shared_task(
    bind=True,
    time_limit=settings.NOTIFY_WEBHOOK_TIMEOUT_S * 3 + 30,
    soft_time_limit=settings.NOTIFY_WEBHOOK_TIMEOUT_S * 3 + 20,
)
def deliver_task(self, delivery_id: int) -> str:
    """Send one delivery (services.deliver). A transient failure is retried after services.backoff_s()
    (exponential, with jitter, capped), up to NOTIFY_MAX_RETRIES times; the last try marks it failed.
    A delivery already sent, failed or claimed is skipped. (Celery's autoretry options are fixed at import;
    the policy here reads the settings when it runs.)"""
    retries = self.request.retries
    try:
        return services.deliver(delivery_id, final=retries >= settings.NOTIFY_MAX_RETRIES)
    except services.TransientDeliveryError as exc:
        raise self.retry(exc=exc, countdown=services.backoff_s(retries), max_retries=settings.NOTIFY_MAX_RETRIES)


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


@shared_task
def fan_out_task(key: str) -> int:
    """After an event's commit: its subject, text and deliveries (services.fan_out; once per event)."""
    return len(services.fan_out(key))
