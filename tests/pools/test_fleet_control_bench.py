"""benchmarks.fleet.control.measure() at a small scale (#28): every figure with its floor, ratio and verdict,
and the world left as it was found."""

from __future__ import annotations

import pytest

from benchmarks.fleet import control as fleet_control
from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity
from pools.models import Allocation, GpuPool, PoolRequest
from pools.models.queue import QueueEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

SCALE = 0.004  # 10 clusters of 5 nodes, 40 projects, 40 waiting requests

FIGURES = ("discovery_first_sync_s", "discovery_resync_s", "approval_ms", "queue_pass_s", "forecast_ms")


def _counts() -> dict:
    models = (Cluster, NodeCapacity, GpuCapacity, MigInstance, PoolRequest, GpuPool, Allocation, QueueEntry)
    return {m.__name__: m.objects.count() for m in models}


def test_measure_reports_each_figure_with_its_floor_and_leaves_the_world_unchanged():
    built = fleet_control.build_world(SCALE)
    assert built["gpus"] == 10 * 5 * 8
    before = _counts()

    result = fleet_control.measure(SCALE)

    for figure in FIGURES:
        assert result[figure] > 0, figure
        assert result[f"{figure}_floor"] > 0, figure
        assert result[f"{figure}_ratio"] == pytest.approx(result[figure] / result[f"{figure}_floor"], rel=0.05)
        assert isinstance(result[f"{figure}_met"], bool), figure
    assert result["database"] == "postgresql"
    assert result["discovery_clusters"] == 10
    assert result["discovery_nodes"] == 50
    assert result["approval_spec"].startswith("H100-80GB")
    assert 0 < result["approval_free_units"] <= MigInstance.objects.count()
    assert result["queue_waiting"] == 40
    # No auto-approval policy: the MIG request that fits is flagged for an operator, nothing approved.
    assert result["queue_approved"] == 0
    assert result["queue_flagged"] == 1
    assert result["forecast_samples"] == fleet_control.FORECAST_SAMPLES
    assert _counts() == before  # approvals and the pass rolled back, the waiting requests and clusters removed
    assert not Cluster.objects.filter(name__startswith="bench-discovery-").exists()


def test_measure_without_a_world_says_what_is_missing():
    with pytest.raises(RuntimeError, match="build a fleet world first"):
        fleet_control.measure(SCALE, discovery=False)
