"""One approval reads a bounded number of units, whatever the number of free ones (#28, PostgreSQL).

Before #28 an approval of one MIG unit counted every free unit of the spec in the fleet (best fit) and ranked
every free unit of the chosen cluster to lock one: 0.7 s at 100,000 free units. Now it counts each cluster
up to a cap (capacity.picking.capped_by_cluster), ranks the cluster's MIG GPUs with an index probe each, and
locks the units of the first GPUs in rank order. This EXPLAIN ANALYZEs every query of one approval on
benchmarks.fleet.control's world at scale 0.1 (10,000 free units, about 1,000 a cluster; build_world
ANALYZEs it: statistics outlive the test's rollback, so a small world of an earlier test cannot mislead the
planner here): MIG instances are reached through index conditions only and no more of them are read than
the cap and chunk allow, and no holder table is hashed whole.
"""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from benchmarks.fleet import control as fleet_control
from capacity import picking
from capacity.choices import SpecKind
from capacity.models import Cluster
from pools import services, units
from pools.models import PoolRequest
from tenancy.models import Project

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

UNITS = "capacity_miginstance"
HOLDERS = {"pools_allocation", "capacity_workloadprofile"}


def _walk(plan: dict, hashed: bool = False):
    """(plan node, inside a hashed SubPlan) for every node. A SubPlan child is hashed when its parent's
    conditions name it "hashed SubPlan N" (EXPLAIN's JSON names the child "SubPlan N")."""
    yield plan, hashed
    conditions = json.dumps({k: v for k, v in plan.items() if k != "Plans"})
    for child in plan.get("Plans", ()):
        name = child.get("Subplan Name", "")
        inside = hashed or (child.get("Parent Relationship") == "SubPlan" and f"hashed {name})" in conditions)
        yield from _walk(child, inside)


def test_one_approval_reads_the_cap_of_units_not_every_free_one():
    fleet_control.build_world(0.1)
    tier, profile = fleet_control.approval_spec()
    project = Project.objects.order_by("pk").first()
    spec = dict(spec_kind=SpecKind.MIG, isolation="mig", product=profile.product, profile_name=profile.name, tier=tier)
    free = units.read_free(PoolRequest(project=project, count=1, **spec)).by_cluster
    assert sum(free.values()) > 9000 and min(free.values()) > 2 * picking.COUNT_CAP
    request = PoolRequest.objects.create(project=project, count=1, state="submitted", **spec)

    with CaptureQueriesContext(connection) as captured, mock.patch.object(services, "enqueue_provisioning"):
        services.approve(request, actor=None)
    selects = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT")]

    read = 0
    for sql in selects:
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            (raw,) = cursor.fetchone()
        for node, hashed in _walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]):
            table = node.get("Relation Name")
            assert not (hashed and table in HOLDERS), sql[:200]  # read whole, once: not a probe per unit
            if table == UNITS:
                assert "Index" in node["Node Type"], (node["Node Type"], sql[:200])
                read += node["Actual Rows"] * node["Actual Loops"]
    # Counting: up to the cap of free units per cluster (and the held ones met on the way, about as many);
    # locking: the units of the first CHUNK GPUs (7 each at most). Not the 10,000 free units.
    clusters = Cluster.objects.count()
    assert 0 < read <= clusters * 3 * picking.COUNT_CAP + picking.CHUNK * 7, read
    assert read < sum(free.values()) / 2
