from django.db import models


class EventKind(models.TextChoices):
    """What people are told about (docs/notifications.md has the table: who, when, where it is sent from)."""

    REQUEST_APPROVED = "request_approved", "Request approved"
    REQUEST_QUEUED = "request_queued", "Request queued"
    REQUEST_STARTED_FROM_QUEUE = "request_started_from_queue", "Request started from the queue"
    REQUEST_REFUSED = "request_refused", "Request refused"
    POOL_EXPIRING = "pool_expiring", "Pool about to expire"
    IDLE_FLAGGED = "idle_flagged", "Idle reservation flagged"
    LOAN_RECLAIMED = "loan_reclaimed", "Loan reclaimed"
    ALLOCATION_ENDED = "allocation_ended", "Allocation ended (maintenance or MIG change)"
    MAINTENANCE_NOTICE = "maintenance_notice", "Maintenance: reservations moving off a node"
    STATEMENT_FINALISED = "statement_finalised", "Statement finalised"
    TRESPASS = "trespass", "Trespass on your units"
    OPERATOR_DIGEST = "operator_digest", "Operators' digest"


# The kinds a project's members and webhooks may subscribe to (the digest is the operators').
PROJECT_KINDS = [k for k in EventKind if k != EventKind.OPERATOR_DIGEST]


class Channel(models.TextChoices):
    EMAIL = "email", "Email"
    WEBHOOK = "webhook", "Webhook"


class WebhookFlavour(models.TextChoices):
    JSON = "json", "Generic JSON (signed)"
    SLACK = "slack", 'Slack-compatible ({"text": ...}, signed)'


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"
