"""benchmarks.fleet.billing.measure on a tiny world: it finds its hour and month in the database, its floors
write the same rows and groups as billing does, and it leaves the world as it found it."""

from datetime import timedelta

import pytest
from django.db import connection

from benchmarks.billing import START, _World
from benchmarks.fleet.billing import measure
from billing.models import MeteringWatermark, Statement, StatementLine, UsageRecord

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="fleet billing measures PostgreSQL floors"),
]


@pytest.fixture
def fleet():
    world = _World("tiny")
    world.build(allocations=20, projects=4)
    world.backfill(1)
    MeteringWatermark.objects.update_or_create(pk=1, defaults={"metered_until": START + timedelta(days=1)})
    return world


def test_measures_metering_and_close_against_their_floors_and_cleans_up(fleet):
    records = UsageRecord.objects.count()

    result = measure(scale=0.0001)

    assert result["metering_hour"] == (START + timedelta(days=1)).isoformat()
    assert result["metering_hour_records"] == result["metering_hour_floor_records"] == 20
    assert result["close_period"] == "2001-01"
    assert result["close_statements"] == 4
    assert result["close_statement_lines"] == result["close_floor_groups"] == 20
    for name in ("metering_hour_s", "metering_hour_floor_s", "close_s", "close_floor_s"):
        # measured, not asserted on: a tiny world's figure may round to 0.0 (tests never assert on wall time)
        assert isinstance(result[name], float) and result[name] >= 0
    assert result["metering_hour_target_s"] == 0.001
    assert result["metering_hour_s_met"] is (result["metering_hour_s"] <= 0.001)
    assert result["close_ratio_met"] is (result["close_ratio"] <= 3)
    assert UsageRecord.objects.count() == records
    assert not Statement.objects.exists() and not StatementLine.objects.exists()
    assert MeteringWatermark.objects.get(pk=1).metered_until == START + timedelta(days=1)


def test_without_usage_it_says_so():
    assert measure() == {"error": "no usage records: build the fleet world first"}
