"""Monthly statements: drafts from unbilled usage, month close, finalising (billing) and adjustments.

Drafts only show; finalise_statement() bills: it stamps the records it bills (UsageRecord.billed_on)
in the same transaction as it writes the lines from exactly those records, so every record is
billed exactly once. A finalised statement never changes (model save/delete and database triggers
refuse); corrections go to the next open period.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from core.leases import crash_point
from pools.models import GpuPool
from tenancy.models import Project

from .. import signals
from ..choices import LineType, RunKind, RunStatus, StatementState
from ..models import BillingRun, MonthNotEnded, Statement, StatementFinalised, StatementLine, UsageRecord
from ..periods import month_bounds, month_start, next_month, previous_month
from .credits import refresh_credits
from .lines import (
    billable_records,
    billed_scope,
    carry_sources,
    event_lines,
    event_projects,
    lines_for,
    refresh_totals,
    round_money,
    statement_rows,
)
from .loans import loan_lines, loan_projects
from .metering import meter_usage


def _refresh_credits_for(period: date, project_ids: list[int] | None, sources: dict[date, list[int]]) -> None:
    start, end = month_bounds(period)
    refresh_credits(start, end, project_ids=project_ids)
    for month, pids in sources.items():
        refresh_credits(*month_bounds(month), project_ids=pids)


def _rewrite_lines(drafts: dict[int, Statement], rows: list[dict], period: date) -> None:
    """Replace the usage, carry-over, credit, trespass, notice, borrowed-unit and lending lines of these drafts
    (by project) from `rows`, the period's events and its loans; keep adjustments."""
    draft_ids = [s.pk for s in drafts.values()]
    StatementLine.objects.filter(statement_id__in=draft_ids).exclude(line_type=LineType.ADJUSTMENT).delete()
    pool_names = dict(GpuPool.objects.filter(pk__in={row["pool_id"] for row in rows}).values_list("pk", "name"))
    new_lines: list[StatementLine] = []
    for row in rows:
        statement = drafts.get(row["project_id"])
        if statement is not None:
            new_lines.extend(lines_for(statement.pk, row, pool_names.get(row["pool_id"], "")))
    new_lines.extend(event_lines(period, {project_id: s.pk for project_id, s in drafts.items()}))
    new_lines.extend(loan_lines(drafts, period))
    StatementLine.objects.bulk_create(new_lines, batch_size=2000)
    refresh_totals(draft_ids)


def generate_statements(period: date, *, project_ids: list[int] | None = None) -> list[Statement]:
    """Create or refresh the draft statements of `period` (a month) from its unbilled usage records.

    Every project with usage to bill gets a statement (those listed in `project_ids`, when given):
    the month's own usage, plus usage metered late into an earlier month whose statement was
    already finalised (carry-over lines naming that month; see carry_sources()). A draft's usage,
    carry-over and credit lines are replaced; its adjustment lines are kept. A finalised statement
    is left exactly as it is. Credits are recomputed first. Nothing is billed here: drafts only
    show; finalise_statement() bills. Locking: the month's statements are locked FOR UPDATE in
    primary-key order, so a concurrent finalise waits for this. Idempotent.
    """
    period = month_start(period)
    sources = carry_sources(period, project_ids=project_ids)
    _refresh_credits_for(period, project_ids, sources)
    with transaction.atomic():
        records = billable_records(period, project_ids=project_ids, sources=sources)
        rows = statement_rows(records, period, carried=list(sources))
        wanted = {row["project_id"] for row in rows} | event_projects(period, project_ids=project_ids)
        wanted |= loan_projects(period, project_ids)
        if project_ids is not None:
            wanted |= set(Project.objects.filter(pk__in=project_ids).values_list("pk", flat=True))
        existing_ids = Statement.objects.filter(period=period)
        if project_ids is not None:
            existing_ids = existing_ids.filter(project_id__in=project_ids)
        wanted |= set(existing_ids.values_list("project_id", flat=True))
        Statement.objects.bulk_create(
            [Statement(project_id=pid, period=period) for pid in sorted(wanted)], ignore_conflicts=True
        )
        statements = list(
            Statement.objects.select_for_update().filter(period=period, project_id__in=wanted).order_by("pk")
        )
        _rewrite_lines({s.project_id: s for s in statements if s.state == StatementState.DRAFT}, rows, period)
    return list(Statement.objects.filter(pk__in=[s.pk for s in statements]).order_by("project_id"))


def generate_statement(project: Project, period: date) -> Statement:
    """The one project's statement for `period`, created or refreshed (see generate_statements)."""
    (statement,) = generate_statements(period, project_ids=[project.pk])  # every set it unions is the project's
    return statement


def ensure_month_ended(period: date, *, now: datetime | None = None) -> None:
    """MonthNotEnded unless `period` (a month) has ended: its usage is still being metered until then."""
    _, end = month_bounds(month_start(period))
    if (now or timezone.now()) < end:
        raise MonthNotEnded(
            f"{period:%Y-%m} has not ended: usage is still being metered into it. "
            f"Finalise or close it from {end:%Y-%m-%d %H:%M} UTC."
        )


def close_month(period: date, *, run: BillingRun | None = None, now: datetime | None = None) -> list[Statement]:
    """Meter up to the end of `period`, then make every project's draft statement for it.

    Beat runs this on the 1st for the month before; operators run it on demand. Only a month that
    has ended is closed (MonthNotEnded otherwise, recorded in `run`). Tracked in `run` when given.
    Idempotent: a second close refreshes drafts and leaves finalised statements alone.
    """
    period = month_start(period)
    _, end = month_bounds(period)
    try:
        ensure_month_ended(period, now=now)
        meter_usage(until=end)
        crash_point("close.metered")  # fault suite: metered up to the month's end, no statements yet
        statements = generate_statements(period)
        crash_point("close.statements")  # fault suite: statements written, run not marked succeeded
    except Exception as exc:
        if run is not None:
            BillingRun.objects.filter(pk=run.pk).update(
                status=RunStatus.FAILED, finished_at=timezone.now(), error=f"{type(exc).__name__}: {exc}"
            )
        raise
    if run is not None:
        BillingRun.objects.filter(pk=run.pk).update(
            status=RunStatus.SUCCEEDED, finished_at=timezone.now(), statements=len(statements)
        )
    return statements


def start_close_run(period: date, *, actor=None, run: BillingRun | None = None) -> BillingRun:
    """Record a month close (in `run` when given, e.g. the admin's unsaved form instance) and enqueue it on commit.

    MonthNotEnded (nothing recorded) for a month that has not ended.
    """
    from ..tasks import close_month_task  # cycle: billing.tasks imports the services

    ensure_month_ended(period)
    task_id = str(uuid.uuid4())
    run = run or BillingRun()
    run.kind, run.period, run.requested_by, run.task_id = RunKind.CLOSE, month_start(period), actor, task_id
    run.status = RunStatus.RUNNING
    run.save()
    transaction.on_commit(
        lambda: close_month_task.apply_async(kwargs={"run_id": run.pk}, task_id=task_id, expires=24 * 3600)
    )
    return run


def finalise_statement(statement: Statement, *, actor=None, now: datetime | None = None) -> Statement:
    """Bill a draft: draft -> finalised, with its lines rewritten from exactly the usage it bills.

    Refused with StatementFinalised when it already is, and with MonthNotEnded (nothing changed)
    while its month has not ended. In one transaction, holding the statement row FOR UPDATE: stamps
    the unbilled records it bills (its month's own and carry-overs) with billed_on =
    this statement (`UPDATE ... WHERE billed_on IS NULL`, so no record is ever billed twice, even by
    two finalisations at once), rewrites its usage, carry-over and credit lines from the records
    stamped (adjustments kept), sets the totals, and claims draft -> finalised with a conditional
    UPDATE. A record metered into the month later is carried over to the next statement. A
    finalised statement never changes again (model save/delete and database triggers refuse).
    """
    current = Statement.objects.filter(pk=statement.pk).values_list("state", "project_id", "period").get()
    state, project_id, period = current
    if state != StatementState.DRAFT:
        raise StatementFinalised(f"statement {statement.pk} is already finalised")
    ensure_month_ended(period, now=now)
    _refresh_credits_for(period, [project_id], carry_sources(period, project_ids=[project_id]))
    with transaction.atomic():
        locked = Statement.objects.select_for_update().get(pk=statement.pk)
        if locked.state != StatementState.DRAFT:
            raise StatementFinalised(f"statement {statement.pk} is already finalised")
        sources = carry_sources(period, project_ids=[project_id])
        billable_records(period, project_ids=[project_id], sources=sources).update(billed_on=locked.pk)
        billed = UsageRecord.objects.filter(billed_scope(period, [project_id], sources), billed_on=locked.pk)
        _rewrite_lines({project_id: locked}, statement_rows(billed, period, carried=list(sources)), period)
        claimed = Statement.objects.filter(pk=locked.pk, state=StatementState.DRAFT).update(
            state=StatementState.FINALISED, finalised_at=timezone.now(), finalised_by=actor
        )
        if claimed != 1:
            raise StatementFinalised(f"statement {statement.pk} is already finalised")
        locked.refresh_from_db()
        signals.statement_finalised.send(sender=Statement, statement=locked, actor=actor)
    statement.refresh_from_db()
    return statement


def finalise_statements(statements, *, actor=None, now: datetime | None = None) -> tuple[int, list[str]]:
    """Finalise the drafts among `statements`, in primary-key order.

    Returns (how many were finalised, why the others were refused: months not ended).
    """
    done, refused = 0, []
    for statement in sorted(statements, key=lambda s: s.pk):
        try:
            finalise_statement(statement, actor=actor, now=now)
            done += 1
        except StatementFinalised:
            continue
        except MonthNotEnded as exc:
            refused.append(f"{statement.project.slug} {statement.period:%Y-%m}: {exc}")
    return done, refused


@transaction.atomic
def add_adjustment(statement: Statement, *, amount: Decimal, reason: str, actor=None) -> StatementLine:
    """An operator's adjustment (credit < 0, charge > 0) with a reason.

    On a draft it becomes a line of that statement. A finalised statement never changes: the
    correction becomes an adjustment line of the project's next open period (the next month's
    statement, created as a draft if needed; skipping months already finalised), pointing back at
    the statement it corrects. Locking: the target statement row FOR UPDATE, so it cannot be
    finalised while the line is added.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("An adjustment needs a reason.")
    amount = Decimal(amount)
    if amount == 0:
        raise ValueError("An adjustment of zero changes nothing.")
    if amount != round_money(amount):
        raise ValueError("Adjustments are in whole cents.")
    target = Statement.objects.select_for_update().get(pk=statement.pk)
    corrects = None
    while target.state == StatementState.FINALISED:
        corrects = corrects or target
        period = next_month(target.period)
        Statement.objects.get_or_create(project_id=statement.project_id, period=period)
        target = Statement.objects.select_for_update().get(project_id=statement.project_id, period=period)
    label = f"Adjustment: {reason}" if corrects is None else f"Correction of {corrects.period:%Y-%m}: {reason}"
    line = StatementLine.objects.create(
        statement=target,
        line_type=LineType.ADJUSTMENT,
        description=label[:200],
        amount=amount,
        reason=reason,
        corrects=corrects,
        created_by=actor,
    )
    refresh_totals([target.pk])
    line.statement.refresh_from_db()
    return line


def previous_period(now: datetime | None = None) -> date:
    return previous_month(month_start(now or timezone.now()))
