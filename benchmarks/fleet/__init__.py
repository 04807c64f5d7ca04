"""`python manage.py bench fleet`: the member read paths at fleet scale (issue #28).

Builds benchmarks.fleet.world in a throwaway PostgreSQL database (`<name>_fleet`, as bench api's
bench_database), then measures each member list (pools, pool requests, allocations, statements, usage,
queue, trespass events) in-process: DRF's APIClient against the real views and middleware, one page of
50, p50 over TRIES requests after two warm-ups, as `fleet-member` (a member of the three oldest
projects) and as a superuser. Method for flatness: the world is built with 1 % of the others' history
(at scale 1: about 10,000 history requests, 14,400 usage hours, 1,200 statements, 1,000 trespass events),
measured, grown to all of it (1,000,000 requests in all) and measured again; ratio = full / 1 %.

Then it imports benchmarks.fleet.billing, screens and control where they exist and merges
what their `measure(scale)` returns (each reads the world in the database) into the same line; a
missing module is named in `skipped`. `all_met` is true when every `*_met` flag of the line is.

Targets per list L: `L_member_p50_ms` <= 30; `L_member_superuser_ratio` <= 2 (the superuser's p50 is
the floor); `L_growth_ratio` <= 1.2. Correctness: the member is never shown another project's row, and
sees rows of its own on every list.
"""

from __future__ import annotations

import importlib
import json
import statistics
import time
from unittest import mock

from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from tenancy.models import Project

from ..pools import bench_database
from ..registry import Smoke, arg, benchmark
from ..targets import correctness, performance
from . import world as fleet_world

TABLES = {  # the table each list pages through
    "pools": "pools_gpupool",
    "pool_requests": "pools_poolrequest",
    "allocations": "pools_allocation",
    "statements": "billing_statement",
    "usage": "billing_usagerecord",
    "queue": "pools_poolrequest",
    "trespass": "monitoring_trespassevent",
}
LISTS = {
    "pools": "/api/v1/pools/",
    "pool_requests": "/api/v1/pool-requests/",
    "allocations": "/api/v1/allocations/",
    "statements": "/api/v1/billing/statements/",
    "usage": "/api/v1/billing/usage/",
    "queue": "/api/v1/pool-requests/queue/",
    "trespass": "/api/v1/monitoring/trespass-events/",
}
PAGE = 50
P50_MS = 30
MEMBER_OVER_SUPERUSER = 2
GROWTH = 1.2
SMALL = 0.01  # the first point: 1 % of the others' history
BUDGET_S = 20.0  # per list and persona
MIN_TRIES = 3
HELPERS = ("billing", "screens", "control")


def _rows(body) -> list[dict]:
    return body if isinstance(body, list) else body.get("results", [])


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def starts_from_projects(sql: str, table: str) -> bool:
    """EXPLAIN: every scan of `table` in the query searches an index by a project column (as
    tests/foundation/test_member_list_plans.py pins on a smaller world)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        (raw,) = cursor.fetchone()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    for node in _nodes(plan):
        if node.get("Relation Name") == table:
            conditions = " ".join(n.get("Index Cond", "") for n in _nodes(node))
            if "project_id" not in conditions:
                return False
    return True


def _foreign(row: dict, allowed: set[str]) -> bool:
    """A row none of whose project columns names one of the member's projects (a trespass event is the
    member's when its unit's owner or its pod's project is; the other one may be masked)."""
    named = [str(row[k]) for k in ("project", "owner_project") if k in row]
    return bool(named) and not any(n in allowed for n in named)


def measure_lists(
    tries: int,
    *,
    budget_s: float = BUDGET_S,
    member: str = fleet_world.MEMBER,
    superuser: str = fleet_world.SUPERUSER,
    stdout=None,
) -> dict:
    """p50 ms per list for the member and the superuser, rows the member saw, and foreign rows shown.

    Each (list, persona) stops after `tries` timed requests or once `budget_s` is spent with at least
    MIN_TRIES done (the operator's unpaginated queue takes seconds a request at fleet scale). A line per
    (list, persona) goes to `stdout`: at fleet scale a run is long, and a slow list must show itself."""
    User = get_user_model()
    personas = {"member": User.objects.get(username=member), "superuser": User.objects.get(username=superuser)}
    mine = Project.objects.filter(
        pk__in=Project.objects.filter(
            projectgroupobjectpermission__group__user=personas["member"]
        ).values("pk")
    )  # fmt: skip
    allowed = {str(v) for p in mine.values("pk", "slug", "name") for v in p.values()}
    figures: dict = {}
    foreign = 0
    fast = {"user": "1000000000/second", "anon": "1000000000/second"}
    with mock.patch.dict(SimpleRateThrottle.THROTTLE_RATES, fast):
        for name, path in LISTS.items():
            for persona, user in personas.items():
                client = APIClient(SERVER_NAME="127.0.0.1")
                client.force_authenticate(user)
                times = []
                spent = 0.0
                for attempt in range(tries + 2):
                    if spent > budget_s and len(times) >= min(MIN_TRIES, tries):
                        break
                    started = time.perf_counter()
                    with CaptureQueriesContext(connection) as captured:
                        response = client.get(path, {"page_size": PAGE})
                    elapsed = (time.perf_counter() - started) * 1000
                    spent += elapsed / 1000
                    if response.status_code != 200:
                        raise RuntimeError(f"{persona} {path}: {response.status_code} {response.content[:300]!r}")
                    if attempt >= 2:
                        times.append(elapsed)
                rows = _rows(response.json())
                figures[f"{name}_{persona}_p50_ms"] = round(statistics.median(times), 2)
                figures[f"{name}_{persona}_rows"] = len(rows)
                figures[f"{name}_{persona}_tries"] = len(times)
                if stdout is not None:
                    p50 = figures[f"{name}_{persona}_p50_ms"]
                    stdout.write(f"fleet: {name} as {persona}: p50 {p50} ms, {len(times)} tries, {spent:.1f} s\n")
                if persona == "member":
                    foreign += sum(1 for r in rows if _foreign(r, allowed))
                    reading = [q["sql"] for q in captured if f'FROM "{TABLES[name]}"' in q["sql"]]
                    figures[f"{name}_member_plan_from_projects"] = all(
                        starts_from_projects(sql, TABLES[name]) for sql in reading
                    )
    figures["foreign_rows"] = foreign
    return figures


def _verdicts(small: dict, full: dict) -> dict:
    """Each list's figures with their floor or target, ratio and `_met` flag."""
    result: dict = {}
    for name in LISTS:
        member, superuser = full[f"{name}_member_p50_ms"], full[f"{name}_superuser_p50_ms"]
        before = small[f"{name}_member_p50_ms"]
        ratio = round(member / superuser, 3) if superuser else None
        growth = round(member / before, 3) if before else None
        result.update(
            {
                f"{name}_member_p50_ms": member,
                f"{name}_member_p50_ms_target": P50_MS,
                f"{name}_member_p50_ms_met": member <= P50_MS,
                f"{name}_superuser_p50_ms": superuser,  # the floor of the member's ratio
                f"{name}_member_superuser_ratio": ratio,
                f"{name}_member_superuser_ratio_target": MEMBER_OVER_SUPERUSER,
                f"{name}_member_superuser_ratio_met": ratio is not None and ratio <= MEMBER_OVER_SUPERUSER,
                f"{name}_member_p50_ms_10k": before,
                f"{name}_superuser_p50_ms_10k": small[f"{name}_superuser_p50_ms"],
                f"{name}_growth_ratio": growth,
                f"{name}_growth_ratio_target": GROWTH,
                f"{name}_growth_ratio_met": growth is not None and growth <= GROWTH,
                f"{name}_member_rows": full[f"{name}_member_rows"],
                # EXPLAIN of the member's page at the full world: reached through the project index.
                f"{name}_member_plan_from_projects_met": full[f"{name}_member_plan_from_projects"],
                f"{name}_tries": [full[f"{name}_member_tries"], full[f"{name}_superuser_tries"]],
            }
        )
    result["foreign_rows"] = small["foreign_rows"] + full["foreign_rows"]
    result["lists_without_member_rows"] = sum(1 for name in LISTS if not full[f"{name}_member_rows"])
    return result


def run_helpers(scale: float, stdout=None, modules: tuple[str, ...] = HELPERS) -> tuple[dict, list[str]]:
    """Merge the dicts of the sibling modules' `measure(scale)`; the names of those not there."""
    merged: dict = {}
    skipped = []
    for module in modules:
        try:
            found = importlib.import_module(f"{__package__}.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{module}":
                raise
            skipped.append(module)
            if stdout is not None:
                stdout.write(f"fleet: {module} not there, skipped\n")
            continue
        if stdout is not None:
            stdout.write(f"fleet: measuring {module}\n")
        started = time.perf_counter()
        merged.update(found.measure(scale=scale))
        merged[f"{module}_s"] = round(time.perf_counter() - started, 2)
        if stdout is not None:
            stdout.write(f"fleet: {module} measured in {merged[f'{module}_s']} s\n")
    return merged, skipped


def all_met(result: dict) -> bool:
    return all(v for k, v in result.items() if k.endswith("_met") and isinstance(v, bool))


def measure_fleet(
    scale: float, tries: int, *, budget_s: float = BUDGET_S, stdout=None, helpers: tuple[str, ...] = HELPERS
) -> dict:
    """Build, measure at 1 % of the others' history, grow to all of it, measure again, run the helpers."""
    started = time.perf_counter()
    world = fleet_world.build(scale, stdout=stdout)
    grown_small = fleet_world.grow(world, SMALL, stdout=stdout)
    small = measure_lists(tries, budget_s=budget_s, stdout=stdout)
    grown_full = fleet_world.grow(world, 1.0, stdout=stdout)
    full = measure_lists(tries, budget_s=budget_s, stdout=stdout)
    result = {
        "benchmark": "fleet",
        "scale": scale,
        "tries": tries,
        "budget_s": budget_s,
        "page_size": PAGE,
        "rows": dict(world.copier.counts),
        "history_rows_10k": grown_small,
        "history_rows_full": grown_full,
        "build_s": world.build_s,
        "build_total_s": round(sum(world.build_s.values()), 2),
        **_verdicts(small, full),
    }
    helper_figures, skipped = run_helpers(scale, stdout, helpers)
    result.update(helper_figures)
    result["skipped"] = skipped
    result["all_met"] = all_met(result)
    result["total_s"] = round(time.perf_counter() - started, 2)
    return result


TARGETS = [
    correctness("foreign_rows", "==", 0),
    correctness("lists_without_member_rows", "==", 0),
    *(performance(f"{name}_member_p50_ms", "<=", P50_MS) for name in LISTS),
    *(performance(f"{name}_member_superuser_ratio", "<=", MEMBER_OVER_SUPERUSER) for name in LISTS),
    *(performance(f"{name}_growth_ratio", "<=", GROWTH) for name in LISTS),
    performance("all_met", "==", True),
]


@benchmark(
    "fleet",
    help="Fleet scale (#28): 100,000 GPUs in 10 clusters, 10,000 projects, 1,000,000 requests; member lists.",
    arguments=[
        arg("--scale", type=float, default=1.0, help="fraction of the fleet to build (0.1: CI-sized)"),
        arg("--tries", type=int, default=15, help="requests per list and persona (p50), after two warm-ups"),
        arg("--budget-s", type=float, default=BUDGET_S, help="seconds per list and persona (at least 3 tries)"),
        arg("--keep-db", action="store_true", help="keep the <name>_fleet database afterwards"),
    ],
    targets=TARGETS,
    smoke=Smoke(("--scale", "0.002", "--tries", "3"), needs=("postgresql",)),
)
def fleet_benchmark(
    *, stdout=None, scale: float, tries: int, budget_s: float = BUDGET_S, keep_db: bool = False, **_
) -> dict:
    fleet_world.require_postgresql()
    if scale <= 0:
        raise ValueError("--scale must be positive")
    with bench_database(keep_db, suffix="fleet"):
        return measure_fleet(scale, tries, budget_s=budget_s, stdout=stdout)
