"""Two clusters whose rows' ids differ across tables: a drain moves reservations inside the node's own
cluster only, and leaves the other cluster's reservations and free units alone."""

import pytest
from drain_sim import drive, fleet, project, reserve

from capacity.models import Cluster, NodeCapacity
from operations import maintenance
from pools.models import Allocation, PoolRequest

pytestmark = pytest.mark.django_db


@pytest.fixture
def two(tmp_path):
    for n in range(5):  # offset the ids of projects and requests against the clusters' and nodes'
        PoolRequest.objects.create(project=project(f"filler-{n}"), state="draft", count=1)
    first = fleet(tmp_path / "one", names=("gpu-a", "gpu-b"))
    second = fleet(tmp_path / "two", names=("gpu-x", "gpu-y", "gpu-z"))
    yield first, second
    first.server.stop()
    second.server.stop()


def test_moves_stay_in_the_drained_nodes_cluster(two):
    first, second = two
    assert first.cluster.pk != second.cluster.pk
    other = reserve("gpu-a", 0)
    moving = [reserve("gpu-x", 0), reserve("gpu-x", 4, "team-b")]

    drain = maintenance.start(NodeCapacity.objects.get(name="gpu-x"), grace_s=0)
    drive(drain)

    assert (drain.step, drain.state, drain.cluster_id) == ("handover", "waiting", second.cluster.pk)
    for a in moving:
        a.refresh_from_db()
        assert a.gpu.node.cluster_id == second.cluster.pk and a.gpu.node.name in ("gpu-y", "gpu-z")
    other.refresh_from_db()
    assert other.gpu.node.name == "gpu-a"
    assert not first.node("gpu-a").unschedulable and second.node("gpu-x").unschedulable
    assert Allocation.objects.filter(gpu__node__cluster=first.cluster).count() == 1
    assert Cluster.objects.count() == 2
