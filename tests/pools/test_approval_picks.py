"""Approval's early-stopping reads (capacity.picking, #28) give what the full reads gave.

- capped_by_cluster: each cluster's free units counted up to a cap are min(the full count, cap), with the same
  definition of a free unit as read_free()'s full count (ending allocations, cordoned nodes, unhealthy GPUs);
- pick_mig_dedicated_first: the same units, in the same order, as _dedicated_first's ranking of every free
  unit of the cluster, for several projects and limits, and a dedicated node late in the cluster still wins;
- choose_clusters over capped counts: best fit among clusters under the cap; the lowest id among those at it.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from benchmarks.fleet import control as fleet_control
from capacity import picking
from capacity.choices import GpuHealth, SpecKind
from capacity.models import GpuCapacity, MigInstance, NodeCapacity
from pools import services, units
from pools.models import Allocation, PoolRequest
from pools.units import take
from tenancy.models import Project

pytestmark = pytest.mark.django_db


def _world():
    fleet_control.build_world(0.01)
    tier, profile = fleet_control.approval_spec()
    return dict(spec_kind=SpecKind.MIG, isolation="mig", product=profile.product, profile_name=profile.name, tier=tier)


def _request(spec: dict, project_id: int, count: int = 1) -> PoolRequest:
    return PoolRequest(project_id=project_id, count=count, **spec)


@pytest.mark.parametrize("kind", [SpecKind.MIG, SpecKind.FULL])
def test_capped_counts_are_the_full_counts_cut_at_the_cap(kind):
    spec = _world()
    candidates, cluster = units.mig_candidates, "gpu__node__cluster_id"
    if kind == SpecKind.FULL:
        spec = dict(spec_kind=SpecKind.FULL, isolation="full", product="H200-141GB", profile_name="", tier="training")
        candidates, cluster = units.full_candidates, "node__cluster_id"
    # Units that are not free in ways a count could miss: an ending allocation, a cordoned node, a sick GPU.
    ended = Allocation.objects.active().filter(mig_instance__isnull=(kind == SpecKind.FULL)).order_by("pk")[:5]
    Allocation.objects.filter(pk__in=[a.pk for a in ended]).update(released_at=timezone.now())
    hosts = NodeCapacity.objects.filter(gpus__mig_mode_current=kind == SpecKind.MIG).distinct().order_by("pk")
    NodeCapacity.objects.filter(pk=hosts[0].pk).update(cordoned=True)
    GpuCapacity.objects.filter(pk=GpuCapacity.objects.filter(node=hosts[1]).order_by("pk")[0].pk).update(
        health=GpuHealth.UNHEALTHY
    )
    request = _request(spec, Project.objects.order_by("pk")[0].pk)
    full = units.read_free(request).by_cluster
    assert sum(full.values()) > 0
    for cap in (1, 3, 10, max(full.values()), 10_000):
        capped = picking.capped_by_cluster(candidates(request), cluster, cap)
        assert capped == {c: min(n, cap) for c, n in full.items() if n}, cap


def _ranked_in_full(request: PoolRequest, cluster_id: int, limit: int) -> list[int]:
    """The order before #28: every free unit of the cluster ranked by _dedicated_first."""
    base = units.mig_candidates(request).filter(gpu__node__cluster_id=cluster_id)
    order = ("gpu__node_id", "gpu_id", "placement_start")
    ranked = take._dedicated_first(base, request, node="gpu__node", gpu="gpu", then=order)
    return list(ranked.values_list("pk", flat=True)[:limit])


def _picked(request: PoolRequest, cluster_id: int, limit: int, chunk: int = picking.CHUNK) -> list[int]:
    base = units.mig_candidates(request).filter(gpu__node__cluster_id=cluster_id)
    return [u.pk for u in picking.pick_mig_dedicated_first(base, request.project_id, cluster_id, limit, chunk)]


def test_the_pick_is_the_full_ranking_cut_at_the_limit():
    spec = _world()
    holders = list(Allocation.objects.active().values_list("project_id", flat=True).distinct().order_by()[:3])
    projects = [*holders, Project.objects.create(name="New", slug="new", namespace="new").pk]
    clusters = sorted(units.read_free(_request(spec, projects[0])).by_cluster)
    for project_id in projects:
        request = _request(spec, project_id)
        for cluster_id in clusters[:3]:
            for limit in (1, 2, 5, 40):
                for chunk in (1, picking.CHUNK):
                    assert _picked(request, cluster_id, limit, chunk) == _ranked_in_full(request, cluster_id, limit)


def test_a_dedicated_node_late_in_the_cluster_is_still_preferred():
    """Not "the best of the first k units": a node no other project holds, the cluster's last, comes first."""
    spec = _world()
    project = Project.objects.create(name="Mine", slug="mine", namespace="mine")
    request = _request(spec, project.pk)
    cluster_id = max(units.read_free(request).by_cluster)
    node = (
        NodeCapacity.objects.filter(cluster_id=cluster_id, gpus__mig_instances__isnull=False)
        .distinct()
        .order_by("-pk")
        .first()
    )
    Allocation.objects.filter(gpu__node=node).delete()  # nobody holds anything on it now
    first = _picked(request, cluster_id, 1)
    assert first == _ranked_in_full(request, cluster_id, 1)
    assert MigInstance.objects.get(pk=first[0]).gpu.node_id == node.pk


def test_best_fit_under_the_cap_and_the_lowest_id_at_it(fleet, make_request, operator, monkeypatch):
    """Clusters are counted up to max(count, COUNT_CAP): the fewest free units win among clusters under the
    cap (best fit, as before); clusters at the cap are alike, and the lowest id wins (before #28: the fewest)."""
    fleet.mig_node("a1", [["3g.40gb", "3g.40gb"], ["3g.40gb", "3g.40gb"]], cluster="a")  # 4 free
    fleet.mig_node("b1", [["3g.40gb", "3g.40gb"], ["3g.40gb"]], cluster="b")  # 3 free
    monkeypatch.setattr(picking, "COUNT_CAP", 4)
    pool = services.approve(make_request(count=1), actor=operator)
    assert pool.cluster.name == "b"  # 3 < 4: counted exactly, the best fit
    monkeypatch.setattr(picking, "COUNT_CAP", 2)
    pool = services.approve(make_request(count=1), actor=operator)
    assert pool.cluster.name == "a"  # a: 4 free, b: 2 now, both shown as 2: the lowest id
    pool = services.approve(make_request(count=3), actor=operator)  # the cap is at least the count
    assert pool.cluster.name == "a"  # a: 3 free (exact under cap 3), b: 2, too few
