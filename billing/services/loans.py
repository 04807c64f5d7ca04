"""Borrowed units on statements (docs/billing.md, Borrowed units): the borrower pays the best-effort rate for
the time it held a lent unit, the lender is credited the same amount; one line each, per loan and month.

Billing only reads loans (pools.Loan): a loan's held time in a month is started_at..returned_at clipped
to the month (and to now for a month not over), priced at the rate card in force at the loan's start
for the lent unit's spec, times the card's `borrowed_multiplier`.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from django.db.models import Q
from django.utils import timezone

from pools.models import Loan
from pricing import rates
from pricing.services import PriceBook

from ..choices import LineType
from ..models import HOUR_S, LINE_ORDER, StatementLine
from ..periods import month_bounds
from .lines import _hours, round_money


def loans_in(period: date, project_ids=None):
    start, end = month_bounds(period)
    loans = Loan.objects.overlapping(start, end).select_related("allocation", "lender_pool__project", "borrower")
    if project_ids is not None:
        loans = loans.filter(Q(borrower_id__in=project_ids) | Q(lender_pool__project_id__in=project_ids))
    return loans.order_by("pk")


def loan_projects(period: date, project_ids=None) -> set[int]:
    """Projects with a borrowed or lent unit in the month: each needs a statement."""
    found: set[int] = set()
    for borrower, lender in loans_in(period, project_ids).values_list("borrower_id", "lender_pool__project_id"):
        found |= {borrower, lender}
    return found if project_ids is None else found & set(project_ids)


def loan_lines(drafts: dict, period: date, *, now: datetime | None = None) -> list[StatementLine]:
    """The borrowed-unit charges and lending credits of these draft statements (by project id)."""
    start, end = month_bounds(period)
    end = min(end, now or timezone.now())
    book = PriceBook()
    lines: list[StatementLine] = []
    for loan in loans_in(period, list(drafts)):
        seconds = loan.held_seconds(start, end)
        if seconds <= 0:
            continue
        unit = loan.allocation
        key = rates.spec_key(unit.kind, unit.product, unit.profile_name, 1)
        card = book.card_at(loan.started_at.replace(minute=0, second=0, microsecond=0))
        multiplier = card.borrowed_multiplier if card is not None else Decimal(0)
        rate = book.price(card, key, unit.compute_slices) * multiplier
        amount = round_money(rate * seconds / HOUR_S)
        common = dict(**rates.spec_fields(key), hourly_rate=rate, hours=_hours(seconds))
        lender = loan.lender_pool.project
        if loan.borrower_id in drafts:
            lines.append(
                StatementLine(
                    statement_id=drafts[loan.borrower_id].pk,
                    line_type=LineType.BORROWED,
                    position=LINE_ORDER[LineType.BORROWED],
                    amount=amount,
                    pool=None,
                    description=f"Borrowed from {lender.slug}: {key.label()} @ {rate.normalize():f}/h "
                    f"(best-effort rate, x{multiplier.normalize():f}), loan #{loan.pk}"[:200],
                    reason=f"loan #{loan.pk}",
                    **common,
                )
            )
        if lender.pk in drafts:
            lines.append(
                StatementLine(
                    statement_id=drafts[lender.pk].pk,
                    line_type=LineType.LENT_CREDIT,
                    position=LINE_ORDER[LineType.LENT_CREDIT],
                    amount=-amount,
                    pool_id=loan.lender_pool_id,
                    description=f"Credit (lent to {loan.borrower.slug}) {loan.lender_pool.name}: {key.label()} "
                    f"@ {rate.normalize():f}/h, loan #{loan.pk}"[:200],
                    reason=f"loan #{loan.pk}",
                    **common,
                )
            )
    return lines
