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


# --- Column lists several billing modules read or show in the same order, named once so they stay in step.
# An allocation as the metering first reads it (the clock's rows, the SQL metering's, the PostgreSQL backend's).
ALLOCATION_COLUMNS = ("id", "project_id", "pool_id", "kind", "product", "profile_name", "compute_slices")

# What a usage record metered for its hour: the spec, the seconds (less the credits) and the rate.
METERED_COLUMNS = (
    "kind",
    "product",
    "profile_name",
    "replicas",
    "seconds",
    "failed_credit_seconds",
    "health_credit_seconds",
    "hourly_rate",
)

# A statement's amounts, in the order the admin's list and the statement's summary show them.
STATEMENT_AMOUNTS = (
    "reserved_amount",
    "credit_amount",
    "adjustment_amount",
    "total_amount",
    "used_amount",
    "idle_amount",
    "unmeasured_amount",
)
