"""The dashboard benchmark runs end to end on a tiny fleet (its figures are measured on PostgreSQL)."""

import pytest

from benchmarks.dashboard import run_dashboard_bench

pytestmark = pytest.mark.django_db


def test_dashboard_benchmark_on_two_nodes():
    result = run_dashboard_bench(nodes=2, repeat=1)
    assert {k: result[k] for k in ("nodes", "gpus", "mig_instances")} == {"nodes": 2, "gpus": 16, "mig_instances": 32}
    # 27: the overview also reads the rate cards its showback is priced with (billing.services.lines), and
    # the capacity plan per tier adds 7 (capacity.services.planning.tier_plan, sharing the busy devices).
    assert result["overview_queries"] <= 27 and result["node_view_page_queries"] <= 20
