"""Finalising while metering writes late usage, or twice at once, on PostgreSQL: every record billed exactly once."""

import threading
from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.db import connection

from billing import services
from billing.models import Statement, StatementFinalised, UsageRecord

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _run_at_once(*calls):
    barrier = threading.Barrier(len(calls))
    results, errors = [], []

    def worker(call):
        try:
            barrier.wait()
            results.append(call())
        except Exception as exc:  # surfaced by the assertions
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(call,)) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


@pytest.fixture(autouse=True)
def _rates(db):
    # transaction=True tests flush the tables after each test, the default card seeded by migration too.
    services.seed_default_card()


def test_two_finalisations_at_once_bill_once(project, allocate):
    allocate(project, "2026-03-10 10:00", "2026-03-10 14:00")
    services.meter_usage(now=at("2026-04-01 00:00"))
    draft = services.generate_statement(project, month("2026-03"))

    results, errors = _run_at_once(
        lambda: services.finalise_statement(draft), lambda: services.finalise_statement(draft)
    )

    assert (len(results), [type(e) for e in errors]) == (1, [StatementFinalised])
    statement = Statement.objects.get()
    assert (statement.state, statement.total_amount, statement.lines.count()) == ("finalised", Decimal("10.00"), 1)
    assert list(UsageRecord.objects.values_list("billed_on", flat=True)) == [statement.pk] * 4


def test_late_usage_metered_while_finalising_is_billed_once_here_or_carried_over(project, allocate):
    allocate(project, "2026-03-10 10:00", "2026-03-10 12:00")
    services.meter_usage(now=at("2026-04-01 00:00"))
    march = services.generate_statement(project, month("2026-03"))
    allocate(project, "2026-03-31 20:00", "2026-04-01 00:00")  # backdated: metered by the next pass

    _, errors = _run_at_once(
        lambda: services.finalise_statement(march), lambda: services.meter_usage(now=at("2026-04-01 02:00"))
    )
    april = services.generate_statement(project, month("2026-04"))
    april = services.finalise_statement(april)

    assert errors == []
    march.refresh_from_db()
    # 6 h at 2.50 were metered; whichever statement took the 4 late hours, they were billed once.
    assert march.total_amount + april.total_amount == Decimal("15.00")
    assert UsageRecord.objects.filter(billed_on__isnull=True).count() == 0
    assert (
        UsageRecord.objects.filter(billed_on=march.pk).count() + UsageRecord.objects.filter(billed_on=april.pk).count()
        == UsageRecord.objects.count()
    )
