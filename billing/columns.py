"""Column lists that several billing modules read or show in the same order, named once so they stay in step."""

from __future__ import annotations

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
