"""Two metering runs at once on PostgreSQL give exactly the totals of one run."""

import threading

import pytest
from billing_helpers import at
from django.db import connection
from django.db.models import Count, Sum

from billing import services
from billing.models import UsageRecord

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _totals():
    return UsageRecord.objects.aggregate(n=Count("id"), seconds=Sum("seconds"))


def test_two_concurrent_runs_equal_one(project, allocate):
    for i in range(6):
        allocate(project, f"2026-03-10 0{i}:20", "2026-03-10 20:40")
    now = at("2026-03-11 00:10")
    barrier = threading.Barrier(2)
    results, errors = [], []

    def worker():
        try:
            barrier.wait()
            results.append(services.meter_usage(now=now))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    concurrent = _totals()
    assert sum(r.hours for r in results) == 24
    # The same allocations metered once, from scratch, in a single run.
    UsageRecord.objects.all().delete()
    from billing.models import MeteringWatermark

    MeteringWatermark.objects.all().delete()
    services.meter_usage(now=now)
    assert concurrent == _totals()
    assert concurrent == {"n": sum(21 - i for i in range(6)), "seconds": sum(73200 - i * 3600 for i in range(6))}
