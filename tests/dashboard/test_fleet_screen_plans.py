"""The operator's screens read fleet-sized tables in the shapes bench fleet needs (issue 28), on PostgreSQL.

On a small fleet world (benchmarks.fleet.world at 1/250: 50 nodes, 400 GPUs, 720 MIG instances, units
held by about 800 active allocations) the queries bench fleet found slow are EXPLAINed:

- the node view's page reads the holders of its own units only: each scan of the allocations in the page's
  availability queries searches an index by the page's ids (a literal array), never the whole table nor
  every active allocation of the fleet (what made the page cost 0.65 s at 100,000 GPUs);
- the MIG instances' counts (capacity.services.planning.mig_unit_counts) carry the tier policies as
  literals: no subquery on the policy table run once per instance;
- the cluster cards' held units join the present GPUs and instances instead of testing `IN (present())`,
  which PostgreSQL hashed over every GPU and instance of the fleet once per parallel worker;

and the figures are the same as the forms they replace. Times are bench fleet's, never asserted here.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.db.models import Count, Q
from django.test.utils import CaptureQueriesContext

from benchmarks.fleet import world as fleet_world
from capacity import tiers
from capacity.models import Cluster, GpuCapacity, MigInstance, WorkloadProfile
from capacity.services import planning
from gpuaas.dashboard import fleet, nodes
from pools.models import Allocation

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

SCALE = 0.004


@pytest.fixture
def fleet_world_small():
    return fleet_world.build(SCALE)


def _plan(sql: str, params=(), *, seqscan: bool = True) -> dict:
    with connection.cursor() as cursor:
        if not seqscan:
            cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (raw,) = cursor.fetchone()
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _scans(plan: dict, table: str) -> list[dict]:
    return [node for node in _nodes(plan) if node.get("Relation Name") == table]


def _largest_cluster() -> Cluster:
    row = GpuCapacity.objects.values("node__cluster_id").annotate(n=Count("pk")).order_by("-n").first()
    return Cluster.objects.get(pk=row["node__cluster_id"])


def test_the_node_view_page_reads_the_holders_of_its_own_units_only(fleet_world_small):
    cluster = _largest_cluster()
    with CaptureQueriesContext(connection) as captured:
        view = nodes.node_view(cluster, 1)
    assert view["nodes"] and any(tile["instances"] for node in view["nodes"] for tile in node["gpus"])
    page = [
        q["sql"]
        for q in captured.captured_queries
        if "CASE WHEN" in q["sql"] and "GROUP BY" not in q["sql"]  # the page's units with their availability
    ]
    assert len(page) == 2  # the page's GPUs, the page's MIG instances
    for sql in page:
        # This world's tables are small enough to read whole; told not to, the planner shows which rows the
        # query can be answered from (at fleet size it chooses this plan itself: bench fleet).
        scans = _scans(_plan(sql, seqscan=False), "pools_allocation")
        assert scans
        for scan in scans:  # narrowed to the page's ids (a literal array), searched by index
            condition = " ".join(scan.get(key, "") for key in ("Index Cond", "Recheck Cond", "Filter"))
            assert scan["Node Type"] != "Seq Scan" and "ANY" in condition, (scan["Node Type"], condition)


def test_the_mig_counts_carry_the_tier_policies_as_literals(fleet_world_small):
    busy = WorkloadProfile.objects.running().multi_device_uuids()
    table = tiers.policies()
    with CaptureQueriesContext(connection) as captured:
        counts = planning.mig_unit_counts(busy, table)
    (sql,) = [q["sql"] for q in captured.captured_queries]
    plan = _plan(sql)
    assert not _scans(plan, "capacity_tierprofilepolicy")
    assert sum(row["n"] for row in counts) == MigInstance.objects.present().count()

    # The same availability as the subquery form every other reader uses (approval's).
    by_subquery = (
        MigInstance.objects.annotate_availability(busy, fleet=True)
        .values("availability", "reserved")
        .annotate(n=Count("pk"))
        .order_by()
    )
    mine: dict = {}
    for row in counts:
        key = (row["availability"], row["reserved"])
        mine[key] = mine.get(key, 0) + row["n"]
    assert mine == {(r["availability"], r["reserved"]): r["n"] for r in by_subquery}


def test_the_cards_held_units_join_the_present_units(fleet_world_small):
    # A lost GPU and a destroyed instance, both still held: neither counts.
    held = Allocation.objects.active()
    lost = held.filter(mig_instance__isnull=True).first().gpu
    GpuCapacity.objects.filter(pk=lost.pk).update(lost_at=lost.last_seen_at)
    gone = held.filter(mig_instance__isnull=False).exclude(gpu=lost).first().mig_instance
    MigInstance.objects.filter(pk=gone.pk).update(state="gone")
    clusters = list(Cluster.objects.order_by("name"))
    ids = [c.pk for c in clusters]

    with CaptureQueriesContext(connection) as captured:
        cards = fleet.cluster_cards(clusters, [])
    (sql,) = [q["sql"] for q in captured.captured_queries if 'FROM "pools_allocation"' in q["sql"]]
    assert not [n for n in _nodes(_plan(sql)) if n.get("Subplan Name")]  # joins, no subquery

    before = (  # the form it replaces
        Allocation.objects.active()
        .filter(gpu__in=GpuCapacity.objects.present(), gpu__node__cluster_id__in=ids)
        .filter(Q(mig_instance__isnull=True) | Q(mig_instance__in=MigInstance.objects.present()))
        .counted("gpu__node__cluster_id")
    )
    assert before
    for card in cards:
        units, gpus = before.get((card["id"],), (0, 0))
        assert card["gpu_equivalents"]["allocated"] == fleet.gpu_count(gpus)
