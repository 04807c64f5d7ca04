"""Choice sets of the billing app."""

from django.db import models


class StatementState(models.TextChoices):
    DRAFT = "draft", "Draft"
    FINALISED = "finalised", "Finalised"


class LineType(models.TextChoices):
    USAGE = "usage", "Reserved usage"
    CARRY_OVER = "carry_over", "Carry-over: usage of an earlier, finalised month"
    HEALTH_CREDIT = "health_credit", "Credit: critical health event"
    FAILED_CREDIT = "failed_credit", "Credit: provisioning failed"
    BORROWED = "borrowed", "Borrowed units (best-effort rate)"
    LENT_CREDIT = "lent_credit", "Credit: units lent to another project"
    ADJUSTMENT = "adjustment", "Adjustment"
    TRESPASS = "trespass", "Trespass: a unit the project did not hold, at the list rate"
    NOTICE = "notice", "Notice: a unit ended early (no charge)"


class RunKind(models.TextChoices):
    METER = "meter", "Metering"
    CLOSE = "close", "Month close"


class RunStatus(models.TextChoices):
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
