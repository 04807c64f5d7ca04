"""Notifications: the events people are told about, where they are sent, and each delivery (the outbox).

An Event is written once per happening (unique `key`, e.g. ``request_approved:12``) by the receivers of
the lower layers' signals (notifications/receivers.py), in the transaction of the change it reports:
one INSERT ... ON CONFLICT DO NOTHING, nothing else on the sender's hot path. After commit a task fans
it out: each (event, recipient, channel) gets one Delivery row, unique by `dedup_key`: a signal sent
twice, a sweep run twice or a task redelivered never makes a second row, and a row is sent only once
it is claimed (notifications/services.py).
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from tenancy.models import Project

from .choices import PROJECT_KINDS, Channel, DeliveryState, EventKind, WebhookFlavour


def new_secret() -> str:
    return secrets.token_hex(32)


class Event(models.Model):
    key = models.CharField(max_length=200, unique=True, editable=False, help_text="What happened, once: kind:id.")
    kind = models.CharField(max_length=32, choices=EventKind, editable=False)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="notification_events", editable=False
    )
    subject = models.CharField(max_length=200, blank=True, editable=False, help_text="Written at fan-out.")
    body = models.TextField(blank=True, editable=False, help_text="Written at fan-out.")
    payload = models.JSONField(default=dict, blank=True, editable=False)
    occurred_at = models.DateTimeField(default=timezone.now, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    fanned_out_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When its deliveries were written (fan_out_task)."
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["kind", "created_at"], name="notifications_event_kind")]

    def __str__(self) -> str:
        return self.subject


class WebhookEndpoint(models.Model):
    """A project's webhook: every event of `events` (empty: all) is POSTed to `url`, signed with `secret`."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhook_endpoints")
    name = models.CharField(max_length=100)
    url = models.URLField(max_length=500, help_text="http(s) URL that receives a POST per event.")
    flavour = models.CharField(max_length=8, choices=WebhookFlavour, default=WebhookFlavour.JSON)
    secret = models.CharField(
        max_length=64, default=new_secret, help_text="HMAC-SHA256 key of the X-Gpuaas-Signature header."
    )
    events = models.JSONField(default=list, blank=True, help_text="Event kinds sent here; empty: every kind.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )

    class Meta:
        ordering = ["project_id", "name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="notifications_webhookendpoint_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.project.slug}: {self.name}"

    def wants(self, kind: str) -> bool:
        return self.enabled and (not self.events or kind in self.events)


class Preference(models.Model):
    """One user's choice for one project: email or not, and which kinds (empty `muted`: every kind).

    No row means the default: every kind by email."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preferences"
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="notification_preferences")
    email = models.BooleanField(default=True, help_text="Send this project's events to the user's email address.")
    muted = models.JSONField(default=list, blank=True, help_text="Event kinds the user is not told about.")

    class Meta:
        ordering = ["project_id", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="notifications_preference_unique_user_project")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project.slug}"

    def wants(self, kind: str) -> bool:
        return self.email and kind not in self.muted

    @staticmethod
    def all_kinds() -> list[str]:
        return [str(k) for k in PROJECT_KINDS]


class Delivery(models.Model):
    """One event to one recipient by one channel: the outbox row that a task sends (and retries)."""

    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries", editable=False)
    channel = models.CharField(max_length=8, choices=Channel, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+", editable=False
    )
    endpoint = models.ForeignKey(
        WebhookEndpoint, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries", editable=False
    )
    address = models.CharField(max_length=500, editable=False, help_text="The email address or URL at fan-out.")
    dedup_key = models.CharField(max_length=300, unique=True, editable=False)
    state = models.CharField(max_length=8, choices=DeliveryState, default=DeliveryState.PENDING, editable=False)
    attempts = models.PositiveIntegerField(default=0, editable=False)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Claimed by a worker until then (sending)."
    )
    sent_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [
            models.CheckConstraint(
                condition=(Q(channel="email", user__isnull=False) | Q(channel="webhook", endpoint__isnull=False)),
                name="notifications_delivery_has_recipient",
            )
        ]
        indexes = [models.Index(fields=["state", "last_attempt_at"], name="notifications_delivery_state")]

    def __str__(self) -> str:
        return f"{self.event.key} -> {self.channel} {self.address}"
