"""Billing workflows: hourly metering, credits, showback and monthly statements.

The rules (docs/billing.md has them in full):

- Nothing is metered for a pool until its provisioning has completed (GpuPool.provisioned_at, or
  an active pool); then the clock starts at Allocation.allocated_at (set by the approval): the
  hours since approval are backfilled. A pool whose provisioning never completes is never billed.
- The clock stops at the earlier of
  Allocation.released_at and the request's end_at (expiry). Each UTC hour of an allocation becomes
  one UsageRecord holding the whole seconds the clock ran in it.
- Provisioning failed: a request that has failed (request or pool state "failed") and never
  became active is not charged at all: all of its usage is credited (the project never got the
  capacity). If a retry later succeeds, the clock still runs from approval, and only the time
  from each failure to the retry that left "failed" (from the request's transitions) is credited.
- Units on a GPU with an open critical health event are credited for that time (not twice when
  also failed).
- The rate is the card in force at the start of each hour: prices change on hour boundaries.
- Amounts are never rounded before statement lines; each line is rounded once to cents.

Rate cards and the PriceBook are pricing's (pricing.services, re-exported here with rate_cards' guard
on re-deriving a metered card). Modules, bottom up: intervals (interval maths), clock (when an
allocation's clock ran and what of it is credited), credits (credits and showback refreshed while a
period is open), metering (hour by hour under the watermark), lines (grouping and pricing records
into statement lines), statements (drafts, close, finalise, adjustments). This package re-exports
what the rest of gpuaas calls, so `from billing import services; services.close_month(...)` works.
"""

from pricing.rates import EPOCH
from pricing.services import PriceBook, copy_rate_card, create_rate_card, default_full_prices, seed_default_card

from .clock import Unit, failed_windows, health_windows, hour_figures
from .credits import refresh_credits, refresh_measurements
from .intervals import Interval
from .lines import (
    billable_records,
    carry_sources,
    draft_lines,
    refresh_totals,
    round_money,
    usage_keys,
    usage_totals,
)
from .metering import MeterResult, catch_up_measurements, insert_records, meter_hour, meter_usage, watermark
from .rate_cards import rederive_card
from .statements import (
    add_adjustment,
    close_month,
    ensure_month_ended,
    finalise_statement,
    finalise_statements,
    generate_statement,
    generate_statements,
    previous_period,
    start_close_run,
)

__all__ = [
    "EPOCH",
    "Interval",
    "MeterResult",
    "PriceBook",
    "Unit",
    "add_adjustment",
    "billable_records",
    "carry_sources",
    "catch_up_measurements",
    "close_month",
    "copy_rate_card",
    "create_rate_card",
    "default_full_prices",
    "draft_lines",
    "ensure_month_ended",
    "failed_windows",
    "finalise_statement",
    "finalise_statements",
    "generate_statement",
    "generate_statements",
    "health_windows",
    "hour_figures",
    "insert_records",
    "meter_hour",
    "meter_usage",
    "previous_period",
    "refresh_credits",
    "refresh_measurements",
    "refresh_totals",
    "rederive_card",
    "round_money",
    "seed_default_card",
    "start_close_run",
    "usage_keys",
    "usage_totals",
    "watermark",
]
