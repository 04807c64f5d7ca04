"""Approval's count of free units (units.read_free) reads each holder table once, not once per unit.

Best fit needs every cluster's count of free units of the spec, so the count visits each candidate unit;
what must not grow with the fleet a second time is a probe per unit into the allocations and workloads
(the EXISTS forms' nested-loop anti-joins: 1.9 s at 25,000 free units, docs/benchmarks.md "fleet:
control plane"). With fleet=True each holder subquery is a hashed SubPlan, run once. EXPLAIN on
PostgreSQL, on benchmarks.fleet.control's stand-in world at a small scale; the counts are those of the
EXISTS forms.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.db.models import Count

from benchmarks.fleet import control as fleet_control
from capacity.choices import SpecKind
from pools import units
from pools.models import PoolRequest

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

HOLDERS = {"pools_allocation", "capacity_workloadprofile"}


def _plan(queryset) -> dict:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (raw,) = cursor.fetchone()
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def _holder_scans(plan: dict, hashed: bool = False):
    """(table, inside a hashed SubPlan) for every scan of a holder table. A SubPlan child is hashed when its
    parent's conditions name it "hashed SubPlan N" (EXPLAIN's JSON names the child "SubPlan N")."""
    if plan.get("Relation Name") in HOLDERS:
        yield plan["Relation Name"], hashed
    conditions = json.dumps(plan)  # the parent's filters and join conditions, among the rest
    for child in plan.get("Plans", ()):
        name = child.get("Subplan Name", "")
        inside = hashed or (child.get("Parent Relationship") == "SubPlan" and f"hashed {name})" in conditions)
        yield from _holder_scans(child, inside)


def _request(spec_kind: str, product: str, profile_name: str = "", tier: str = "") -> PoolRequest:
    isolation = "mig" if spec_kind == SpecKind.MIG else "full"
    return PoolRequest(spec_kind=spec_kind, isolation=isolation, product=product, profile_name=profile_name, tier=tier)


@pytest.mark.parametrize("spec_kind", [SpecKind.MIG, SpecKind.FULL])
def test_free_units_are_counted_with_each_holder_read_once(spec_kind):
    fleet_control.build_world(0.01)
    tier, profile = fleet_control.approval_spec()
    if spec_kind == SpecKind.MIG:
        request = _request(SpecKind.MIG, profile.product, profile.name, tier)
        counted = units.mig_candidates(request, frozenset(), fleet=True)
        probed = units.mig_candidates(request, frozenset())
        cluster = "gpu__node__cluster"
    else:
        request = _request(SpecKind.FULL, "H200-141GB", tier="training")
        counted = units.full_candidates(request, frozenset(), fleet=True)
        probed = units.full_candidates(request, frozenset())
        cluster = "node__cluster"

    def per_cluster(queryset):
        return queryset.values(cluster).annotate(n=Count("pk")).order_by()

    scans = list(_holder_scans(_plan(per_cluster(counted))))
    assert {table for table, _ in scans} == HOLDERS
    assert all(hashed for _, hashed in scans), scans
    # The same units as the EXISTS forms approval locks from, and what read_free reports.
    free = {r[cluster]: r["n"] for r in per_cluster(counted)}
    assert free == {r[cluster]: r["n"] for r in per_cluster(probed)}
    assert sum(free.values()) > 0
    assert units.read_free(request).by_cluster == free
