"""billing: what each project owes, hour by hour and month by month.

Owns UsageRecord, MeteringWatermark, Statement, StatementLine and BillingRun (models; a finalised statement
is refused UPDATE and DELETE by database triggers), hourly metering from allocations and loans, credits,
statement lines and monthly statements, and the one rate-card rule that needs usage records: a card whose
hours were metered is never re-derived (services/). Also period arithmetic (periods), CSV exports (exports/),
the dialect-specific SQL (backends/), and the metering, month-close and sweep tasks. Rate cards are pricing's.

Layer: above operations, monitoring, scheduling, pools, pricing, capacity, core and tenancy, which it may
import (it reads allocations, loans, prices and measurements); below notifications and gpuaas. It needs no
signal from below: metering reads the rows on its beat. It tells notifications through
billing.signals.statement_finalised, sent inside the transaction that finalised the statement.
"""
