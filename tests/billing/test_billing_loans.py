"""Borrowed units: the borrower pays the best-effort rate for the time it held a lent unit, the lender is credited
the same; both statements say so, and each month bills only its own part of a loan (docs/billing.md)."""

from decimal import ROUND_HALF_UP, Decimal

import pytest
from billing_helpers import at, month

from billing import services
from billing.choices import LineType
from pools.choices import LoanState
from pools.models import Loan
from pricing import rates
from pricing.models import RateCard
from pricing.services import PriceBook

pytestmark = pytest.mark.django_db


def _loan(allocation, borrower, start, returned=None):
    return Loan.objects.create(
        allocation=allocation,
        lender_pool=allocation.pool,
        borrower=borrower,
        started_at=at(start),
        state=LoanState.ENDED if returned else LoanState.ACTIVE,
        returned_at=at(returned) if returned else None,
    )


def _best_effort_rate(when) -> Decimal:
    book = PriceBook()
    card = book.card_at(when)
    return book.price(card, rates.spec_key("full", "H100-80GB"), 7) * card.borrowed_multiplier


def test_borrower_pays_the_best_effort_rate_and_lender_is_credited(project, other_project, allocate):
    unit = allocate(project, "2026-03-10 00:00")
    _loan(unit, other_project, "2026-03-10 10:00", "2026-03-10 12:30")
    services.meter_usage(now=at("2026-03-10 14:00"))

    borrower = services.generate_statement(other_project, month("2026-03"))
    lender = services.generate_statement(project, month("2026-03"))

    rate = _best_effort_rate(at("2026-03-10 10:00"))
    assert rate > 0
    amount = (rate * Decimal("2.5")).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    charge = borrower.lines.get(line_type=LineType.BORROWED)
    assert (charge.hours, charge.amount, charge.hourly_rate) == (Decimal("2.5"), amount, rate)
    assert charge.description.startswith(f"Borrowed from {project.slug}: ")
    assert "best-effort rate" in charge.description
    assert borrower.total_amount == amount  # it held nothing else
    credit = lender.lines.get(line_type=LineType.LENT_CREDIT)
    assert (credit.hours, credit.amount) == (Decimal("2.5"), -amount)
    assert f"lent to {other_project.slug}" in credit.description
    assert lender.credit_amount == -amount
    assert lender.total_amount == lender.reserved_amount - amount


def test_each_month_bills_only_the_time_held_in_it_and_an_open_loan_until_now(project, other_project, allocate):
    unit = allocate(project, "2026-03-01 00:00")
    _loan(unit, other_project, "2026-03-31 23:00", "2026-04-01 01:30")
    services.meter_usage(now=at("2026-04-01 03:00"))
    march = services.generate_statement(other_project, month("2026-03")).lines.get(line_type=LineType.BORROWED)
    april = services.generate_statement(other_project, month("2026-04")).lines.get(line_type=LineType.BORROWED)
    assert (march.hours, april.hours) == (Decimal("1"), Decimal("1.5"))


def test_the_multiplier_is_the_rate_cards(project, other_project, allocate):
    RateCard.objects.update(borrowed_multiplier=Decimal("0.25"))
    unit = allocate(project, "2026-03-10 00:00")
    _loan(unit, other_project, "2026-03-10 10:00", "2026-03-10 11:00")
    statement = services.generate_statement(other_project, month("2026-03"))
    full = PriceBook().price(RateCard.objects.get(), rates.spec_key("full", "H100-80GB"), 7)
    assert statement.lines.get(line_type=LineType.BORROWED).hourly_rate == full * Decimal("0.25")
