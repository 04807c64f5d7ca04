"""benchmarks.fleet.screens.measure runs end to end on a small world (its figures are measured on PostgreSQL)."""

import pytest
from django.db import connection

from benchmarks.fleet.screens import CHANGELISTS, build_world, measure

pytestmark = pytest.mark.django_db


def test_measure_reads_the_world_in_the_database():
    build_world(2, clusters=2, history=0)
    if connection.vendor == "postgresql":
        # The changelists' estimates read pg_class.reltuples, which an earlier test's big world (thousands of
        # projects, then ANALYZE) leaves behind: a rolled-back test does not roll statistics back. Measure
        # this world's own.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    result = measure(repeat=1)

    assert (result["clusters"], result["nodes"], result["gpus"], result["mig_instances"]) == (2, 4, 32, 64)
    assert result["dashboard_json_queries"] > 0 and result["node_view_queries"] > 0
    assert set(result["changelists"]) == {name for name, _ in CHANGELISTS}
    assert not any(c["estimated"] for c in result["changelists"].values())  # small tables: exact counts
    assert result["changelist_counts_met"] is True
    for figure in ("dashboard_json_s", "node_view_ms", "changelist_max_s"):
        assert isinstance(result[f"{figure}_met"], bool)
