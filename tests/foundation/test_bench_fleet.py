"""bench fleet's builder and member paths at a tiny scale (benchmarks/fleet/world.py, benchmarks/fleet/__init__.py).

The PostgreSQL test builds the fleet at 1/500 (25 nodes, 200 GPUs, 20 projects, 2,000 requests) with
COPY, checks the rows are the product's (units held once, states, queue entries, the member's three
projects) and runs the member read paths once: the member sees its own rows on every list and never
another project's. Timings are printed by the benchmark, never asserted here.
"""

from __future__ import annotations

import io
import sys
import types

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import Count, F

from benchmarks import fleet
from benchmarks.fleet import world as fleet_world
from pools.models import Allocation, GpuPool, PoolRequest
from pools.models.queue import QueueEntry
from tenancy import roles
from tenancy.models import Project

SCALE = 0.002


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_tiny_fleet_is_valid_and_its_member_sees_only_its_own_rows():
    world = fleet_world.build(SCALE)
    sizes = world.sizes()
    grown = fleet_world.grow(world, fleet.SMALL)
    assert grown["pools_poolrequest"] == int(fleet.SMALL * world.history_base["count"])
    fleet_world.grow(world, 1.0)

    assert PoolRequest.objects.filter(project_id__in=world.project_ids).count() == sizes["requests"]
    assert QueueEntry.objects.count() == PoolRequest.objects.filter(state="queued").count() == sizes["queued"]
    active = Allocation.objects.filter(released_at__isnull=True, project_id__in=world.project_ids)
    units = world.copier.counts["capacity_gpucapacity"]  # 200 GPUs: 80 full, 80 MIG, 40 time-sliced
    assert active.count() > units  # MIG instances and replicas: more units than GPUs
    # Every active allocation's pool is active and in its project; a unit is held once (the constraints).
    assert not active.exclude(pool__state="active").exists()
    assert not active.exclude(pool__project_id=F("project_id")).exists()
    kinds = dict(active.values_list("kind").annotate(n=Count("pk")).order_by())
    assert set(kinds) == {"full", "mig", "timeslice"}
    assert not GpuPool.objects.filter(state="released", released_at__isnull=True).exists()

    member = roles.projects_for(get_user_model().objects.get(username=fleet_world.MEMBER))
    assert sorted(member.values_list("pk", flat=True)) == world.member_project_ids
    assert Project.objects.filter(pk__in=world.project_ids).count() == sizes["projects"]

    progress = io.StringIO()
    figures = fleet.measure_lists(tries=1, stdout=progress)
    lines = progress.getvalue().splitlines()  # one per list and persona: a slow list shows itself during the run
    assert len(lines) == 2 * len(fleet.LISTS)
    assert lines[0].startswith(f"fleet: {next(iter(fleet.LISTS))} as member: p50 ")
    assert figures["foreign_rows"] == 0
    assert all(figures[f"{name}_member_rows"] > 0 for name in fleet.LISTS)
    assert figures["pool_requests_superuser_rows"] == fleet.PAGE


@pytest.mark.django_db
def test_bench_fleet_refuses_sqlite():
    if connection.vendor == "postgresql":
        pytest.skip("the refusal is SQLite's")
    with pytest.raises(CommandError, match="PostgreSQL"):
        call_command("bench", "fleet", "--scale", "0.001")


def test_the_helpers_merge_into_one_line_and_missing_ones_are_named(monkeypatch):
    helper = types.ModuleType("benchmarks.fleet.fleet_probe")
    helper.measure = lambda scale=1.0: {"probe_s": scale, "probe_met": scale < 1}
    monkeypatch.setitem(sys.modules, "benchmarks.fleet.fleet_probe", helper)
    progress = io.StringIO()
    merged, skipped = fleet.run_helpers(0.5, progress, modules=("fleet_probe", "fleet_not_written_yet"))
    assert skipped == ["fleet_not_written_yet"]
    lines = progress.getvalue().splitlines()
    assert lines[0] == "fleet: measuring fleet_probe" and lines[1].startswith("fleet: fleet_probe measured in ")
    assert lines[2] == "fleet: fleet_not_written_yet not there, skipped"
    assert merged["probe_s"] == 0.5 and merged["probe_met"] is True
    assert fleet.all_met({"a_met": True, **merged}) is True
    assert fleet.all_met({"a_met": True, "b_met": False}) is False
