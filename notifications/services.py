"""Recording events, fanning them out to recipients, and sending each delivery once.

record() runs in the transaction of the change it reports (the receivers call it from the lower layers'
signals): it writes the Event once (unique key; a second call with the same key does nothing) with one
INSERT and enqueues its fan-out on commit, so nothing is sent for a change that rolled back. fan_out()
(a task, after commit) writes the subject and text and one Delivery per (recipient, channel) that
wants it (unique dedup_key), and enqueues each delivery after its own commit.

deliver() sends one delivery: it claims the row with a conditional UPDATE (pending and not leased), so
a task run twice or a redelivered message sends it once; a transient failure (network, 408/429/5xx, an
SMTP error) leaves it pending and raises TransientDeliveryError, which the task retries with backoff;
the last try, or a permanent failure (another 4xx), marks it failed. A worker that dies mid-send leaves
a lease that runs out; sweep() re-enqueues pending deliveries nobody tried for NOTIFY_SWEEP_S.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import smtplib
from collections import Counter

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from pools.models import PoolRequest
from tenancy import roles
from tenancy.models import Project

from . import messages
from .adapters import webhooks
from .choices import Channel, DeliveryState, EventKind, WebhookFlavour
from .models import Delivery, Event, Preference, WebhookEndpoint

logger = logging.getLogger(__name__)


class TransientDeliveryError(Exception):
    """A delivery failed in a way that another try may fix (the task retries it with backoff)."""


# --- Recording and fan-out ------------------------------------------------------------------------


def record(
    *,
    kind: str,
    key: str,
    project_id: int | None,
    payload: dict,
    occurred_at: dt.datetime | None = None,
    subject: str = "",
    body: str = "",
) -> None:
    """Write the event `key` once and fan it out after commit (fan_out_task). Runs in the caller's transaction.

    One statement, INSERT ... ON CONFLICT DO NOTHING: a second call with the same key, or a concurrent twin,
    writes nothing and never aborts the caller's transaction. The fan-out task is enqueued either way; it
    does nothing for an event fanned out already. `payload` holds what the message needs (JSON values);
    `subject` and `body` are worked out at fan-out (notifications/messages.py) unless given (the digest).
    """
    from .tasks import fan_out_task  # cycle: notifications.tasks imports this module

    Event.objects.bulk_create(
        [
            Event(
                key=key,
                kind=kind,
                project_id=project_id,
                payload=payload,
                occurred_at=occurred_at or timezone.now(),
                subject=subject[:200],
                body=body,
            )
        ],
        ignore_conflicts=True,
    )
    fan_out_task.delay_on_commit(key)


def email_recipients(project: Project, kind: str) -> list:
    """The project's active members with an email address who want `kind` by email (one query for preferences)."""
    users = {u.pk: u for u, _role in roles.members(project) if u.is_active and u.email}
    prefs = {p.user_id: p for p in Preference.objects.filter(project=project, user_id__in=list(users))}
    return [u for pk, u in sorted(users.items()) if pk not in prefs or prefs[pk].wants(kind)]


def recipients(event: Event) -> tuple[list, list[WebhookEndpoint]]:
    """(users to mail, webhooks to call) for `event`: the operators for the digest (when it has events), else
    the project's members who want the kind by email and the project's enabled webhooks that want it."""
    if event.kind == EventKind.OPERATOR_DIGEST:
        return (list(operators()) if event.payload.get("total") else []), []
    if event.project is None:
        return [], []
    endpoints = WebhookEndpoint.objects.filter(project=event.project, enabled=True).order_by("pk")
    return email_recipients(event.project, event.kind), [e for e in endpoints if e.wants(event.kind)]


def fan_out(key: str, *, now: dt.datetime | None = None) -> list[int]:
    """Write the event's subject and text and one Delivery per recipient and channel; enqueue them after commit.

    Claimed with a conditional UPDATE (fanned_out_at still empty), in one transaction: an event is fanned
    out once however many tasks run; a delivery whose dedup_key exists is not written again. Returns the
    ids of the deliveries enqueued ([] when the event is gone or was fanned out already)."""
    now = now or timezone.now()
    with transaction.atomic():
        if Event.objects.filter(key=key, fanned_out_at__isnull=True).update(fanned_out_at=now) != 1:
            return []
        event = Event.objects.select_related("project").get(key=key)
        event.subject, event.body = messages.render(event)
        Event.objects.filter(pk=event.pk).update(subject=event.subject, body=event.body)
        users, endpoints = recipients(event)
        rows = [
            Delivery(
                event=event,
                channel=Channel.WEBHOOK,
                endpoint=endpoint,
                address=endpoint.url,
                dedup_key=f"{event.key}|webhook|endpoint:{endpoint.pk}",
            )
            for endpoint in endpoints
        ] + [
            Delivery(
                event=event,
                channel=Channel.EMAIL,
                user=user,
                address=user.email,
                dedup_key=f"{event.key}|email|user:{user.pk}",
            )
            for user in users
        ]
        Delivery.objects.bulk_create(rows, ignore_conflicts=True)
        ids = list(
            Delivery.objects.filter(event=event, state=DeliveryState.PENDING)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        enqueue_deliveries(ids)
    return ids


def enqueue_deliveries(delivery_ids: list[int]) -> None:
    """One deliver_task per delivery, enqueued after commit (nothing if the transaction rolls back)."""
    from .tasks import deliver_task  # cycle: notifications.tasks imports this module

    for pk in delivery_ids:
        deliver_task.delay_on_commit(pk)


# --- Sending --------------------------------------------------------------------------------------


def webhook_payload(delivery: Delivery) -> dict:
    event = delivery.event
    if delivery.endpoint.flavour == WebhookFlavour.SLACK:
        return {"text": f"*{event.subject}*\n{event.body}"}
    return {
        "id": event.key,
        "kind": event.kind,
        "project": event.project.slug if event.project else None,
        "subject": event.subject,
        "text": event.body,
        "occurred_at": event.occurred_at.isoformat(),
        "data": event.payload,
    }


def _send(delivery: Delivery) -> webhooks.Answer:
    if delivery.channel == Channel.WEBHOOK:
        endpoint = delivery.endpoint
        if not endpoint.enabled:
            return webhooks.Answer(False, False, None, "the endpoint was disabled")
        return webhooks.post(
            endpoint.url,
            webhook_payload(delivery),
            secret=endpoint.secret,
            event=delivery.event.kind,
            delivery=delivery.dedup_key,
            timeout_s=settings.NOTIFY_WEBHOOK_TIMEOUT_S,
        )
    if not delivery.user.is_active or not delivery.user.email:
        return webhooks.Answer(False, False, None, "the user is inactive or has no email address")
    event = delivery.event
    try:
        send_mail(
            f"[gpuaas] {event.subject}",
            event.body,
            settings.DEFAULT_FROM_EMAIL,
            [delivery.user.email],
            fail_silently=False,
        )
    except (smtplib.SMTPException, OSError) as exc:
        permanent = isinstance(exc, smtplib.SMTPRecipientsRefused)
        return webhooks.Answer(False, not permanent, None, f"{type(exc).__name__}: {exc}"[:500])
    return webhooks.Answer(True, False, None, "")


def deliver(delivery_id: int, *, final: bool = False, now: dt.datetime | None = None) -> str:
    """Send one delivery if it is still pending and not claimed; returns "sent", "failed", "skipped".

    Raises TransientDeliveryError after a transient failure unless `final` (the task's last try), when
    the delivery is marked failed instead. Each try counts in `attempts`, with its status and error.
    """
    now = now or timezone.now()
    lease = dt.timedelta(seconds=settings.NOTIFY_WEBHOOK_TIMEOUT_S * 3 + 30)
    unclaimed = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    claimed = (
        Delivery.objects.filter(unclaimed, pk=delivery_id, state=DeliveryState.PENDING).update(
            lease_expires_at=now + lease, attempts=F("attempts") + 1, last_attempt_at=now
        )
        == 1
    )
    if not claimed:
        return "skipped"
    delivery = Delivery.objects.select_related("event__project", "endpoint", "user").get(pk=delivery_id)
    answer = _send(delivery)
    mine = Delivery.objects.filter(pk=delivery_id, state=DeliveryState.PENDING)
    if answer.ok:
        mine.update(state=DeliveryState.SENT, sent_at=timezone.now(), lease_expires_at=None, last_status=answer.status)
        return "sent"
    fields = {"lease_expires_at": None, "last_status": answer.status, "last_error": answer.error}
    if answer.transient and not final:
        mine.update(**fields)
        raise TransientDeliveryError(f"delivery {delivery_id} to {delivery.address}: {answer.error}")
    mine.update(state=DeliveryState.FAILED, **fields)
    logger.warning("delivery %s to %s failed for good: %s", delivery_id, delivery.address, answer.error)
    return "failed"


def backoff_s(retries: int, *, rand=random.random) -> float:
    """Seconds before retry number `retries` + 1: NOTIFY_RETRY_BACKOFF_S doubled per retry, capped at
    NOTIFY_RETRY_BACKOFF_MAX_S, of which the second half is random (so retries of many deliveries spread out)."""
    ceiling = min(settings.NOTIFY_RETRY_BACKOFF_MAX_S, settings.NOTIFY_RETRY_BACKOFF_S * 2**retries)
    return ceiling / 2 + rand() * ceiling / 2


def sweep(*, now: dt.datetime | None = None, limit: int = 500) -> list[int]:
    """Re-enqueue pending deliveries no one has tried for NOTIFY_SWEEP_S (a lost message, a dead worker), and
    the fan-out of events not fanned out that long. Returns the deliveries' ids."""
    now = now or timezone.now()
    quiet = now - dt.timedelta(seconds=settings.NOTIFY_SWEEP_S)
    stale = (
        Delivery.objects.filter(state=DeliveryState.PENDING)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        .filter(Q(last_attempt_at__lt=quiet) | Q(last_attempt_at__isnull=True, created_at__lt=quiet))
    )
    ids = list(stale.order_by("pk").values_list("pk", flat=True)[:limit])
    enqueue_deliveries(ids)
    from .tasks import fan_out_task  # cycle: notifications.tasks imports this module

    unfanned = Event.objects.filter(fanned_out_at__isnull=True, created_at__lt=quiet).order_by("pk")
    for key in unfanned.values_list("key", flat=True)[:limit]:
        fan_out_task.delay_on_commit(key)
    return ids


# --- Sweeps that notice things --------------------------------------------------------------------


def announce_expiring(*, now: dt.datetime | None = None, limit: int = 500) -> int:
    """Announce, once per end date, every holding pool whose end is within NOTIFY_EXPIRY_WINDOW_H.

    The key includes the end: a pool whose end was moved later is announced again when the new end nears.
    Returns how many were announced now."""
    now = now or timezone.now()
    window = dt.timedelta(hours=settings.NOTIFY_EXPIRY_WINDOW_H)
    due = (
        PoolRequest.objects.holding().filter(end_at__gt=now, end_at__lte=now + window).order_by("end_at", "pk")[:limit]
    )
    known = set(
        Event.objects.filter(kind=EventKind.POOL_EXPIRING, payload__request__in=[r.pk for r in due]).values_list(
            "key", flat=True
        )
    )
    announced = 0
    for request in due:
        key = f"{EventKind.POOL_EXPIRING}:{request.pk}:{int(request.end_at.timestamp())}"
        if key in known:
            continue
        with transaction.atomic():
            record(
                kind=EventKind.POOL_EXPIRING,
                key=key,
                project_id=request.project_id,
                payload={
                    "request": request.pk,
                    "label": request.name or f"{request.spec_label} x {request.count}",
                    "end": f"{request.end_at:%Y-%m-%d %H:%M}",
                    "hours": int((request.end_at - now).total_seconds() // 3600),
                },
                occurred_at=now,
            )
        announced += 1
    return announced


def operators():
    """Active operators with an email address: staff who are superusers or in the Operators group."""
    return (
        get_user_model()
        .objects.filter(is_active=True, is_staff=True)
        .filter(Q(is_superuser=True) | Q(groups__name=roles.OPERATORS_GROUP))
        .exclude(email="")
        .distinct()
        .order_by("pk")
    )


def digest_period_end(now: dt.datetime) -> dt.datetime:
    """The start of the digest period `now` falls in (periods of NOTIFY_DIGEST_INTERVAL_H from the epoch, UTC)."""
    step = settings.NOTIFY_DIGEST_INTERVAL_H * 3600
    return dt.datetime.fromtimestamp(int(now.timestamp()) // step * step, tz=dt.UTC)


def operator_digest(*, now: dt.datetime | None = None) -> Event | None:
    """Mail the operators one summary of the events since the previous digest, once per period.

    Idempotent: the digest is itself an Event keyed by its period's end; a second run in the same period
    (or a concurrent one) does nothing. A period without events is recorded but mails no one.
    """
    now = now or timezone.now()
    end = digest_period_end(now)
    key = f"{EventKind.OPERATOR_DIGEST}:{end:%Y-%m-%dT%H:%MZ}"
    if Event.objects.filter(key=key).exists():
        return None
    previous = Event.objects.filter(kind=EventKind.OPERATOR_DIGEST, occurred_at__lt=end).order_by("-occurred_at")
    start = previous.values_list("occurred_at", flat=True).first() or end - dt.timedelta(
        hours=settings.NOTIFY_DIGEST_INTERVAL_H
    )
    events = list(
        Event.objects.exclude(kind=EventKind.OPERATOR_DIGEST)
        .filter(created_at__gte=start, created_at__lt=end)
        .select_related("project")
        .order_by("created_at", "pk")
    )
    by_kind = Counter(EventKind(e.kind).label for e in events)
    lines = [f"{len(events)} events from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC."]
    lines += [f"  {label}: {n}" for label, n in sorted(by_kind.items())]
    if events:
        lines.append("")
        lines += [f"- {e.created_at:%Y-%m-%d %H:%M} {e.subject}" for e in events[:200]]
        if len(events) > 200:
            lines.append(f"... and {len(events) - 200} more (admin: Notifications > Events)")
    lines.append(messages.link("/admin/notifications/event/"))
    with transaction.atomic():
        record(
            kind=EventKind.OPERATOR_DIGEST,
            key=key,
            project_id=None,
            subject=f"gpuaas digest: {len(events)} events to {end:%Y-%m-%d %H:%M} UTC",
            body="\n".join(lines),
            payload={"start": start.isoformat(), "end": end.isoformat(), "total": len(events), "counts": dict(by_kind)},
            occurred_at=end,
        )
    return Event.objects.get(key=key)


def send_again(delivery_ids: list[int]) -> int:
    """Operator: failed deliveries go back to pending and are enqueued after commit. Returns how many."""
    with transaction.atomic():
        ids = list(
            Delivery.objects.filter(pk__in=delivery_ids, state=DeliveryState.FAILED)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        Delivery.objects.filter(pk__in=ids, state=DeliveryState.FAILED).update(
            state=DeliveryState.PENDING, lease_expires_at=None
        )
        enqueue_deliveries(ids)
    return len(ids)
