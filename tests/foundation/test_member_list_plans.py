"""A member's list pages start from the member's own projects, whatever the rest of the fleet holds.

The PostgreSQL test builds bench api's world (tenancy.roles.project_id_list_for, gpuaas.permissions.
ProjectScopedQuerysetMixin): thousands of other projects with requests, pools, allocations, usage,
statements and trespass events, and a member of a few of the oldest projects (the worst case for a
plan that walks the newest rows and filters). Each member list is requested through the API, and every
query it ran is EXPLAINed: no big table may be read whole (Seq Scan) and the list's own table must be
reached through an index condition on its project column, so a plan regression fails here rather than
in a benchmark run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from benchmarks.pools import build_api_world
from billing.models import Statement, UsageRecord
from gpuaas.api import usernames_only
from monitoring.choices import TrespassKind
from monitoring.models import TrespassEvent
from pools.models import Allocation, PoolRequest
from tenancy import roles
from tenancy.choices import Role
from tenancy.models import Project

OTHER_PROJECTS = 3000
MEMBER_PROJECTS = 3
BIG = 1000  # a table with more rows than this is never read whole by a member's list

# Each member list and the table whose rows it pages through.
MEMBER_LISTS = {
    "/api/v1/pool-requests/": "pools_poolrequest",
    "/api/v1/allocations/": "pools_allocation",
    "/api/v1/pools/": "pools_gpupool",
    "/api/v1/billing/statements/": "billing_statement",
    "/api/v1/billing/usage/": "billing_usagerecord",
    "/api/v1/monitoring/trespass-events/": "monitoring_trespassevent",
    "/api/v1/pool-requests/queue/": "pools_poolrequest",
}


def _add_history() -> None:
    """Usage hours, a statement and a trespass event for every project's allocation (bulk inserts)."""
    hour = datetime(2026, 11, 1, tzinfo=UTC)
    allocations = list(Allocation.objects.select_related("pool").order_by("id"))
    UsageRecord.objects.bulk_create(
        [
            UsageRecord(
                allocation=a,
                hour=hour + timedelta(hours=h),
                project_id=a.project_id,
                pool=a.pool,
                kind="full",
                product="H100-80GB",
                seconds=3600,
                hourly_rate=Decimal("2.5"),
            )
            for a in allocations
            for h in range(2)
        ],
        2000,
    )
    Statement.objects.bulk_create([Statement(project_id=a.project_id, period=hour.date()) for a in allocations], 2000)
    TrespassEvent.objects.bulk_create(
        [
            TrespassEvent(
                kind=TrespassKind.FOREIGN_POD,
                gpu_id=a.gpu_id,
                unit_key=f"gpu:{a.gpu_id}",
                owner_project_id=a.project_id,
                pod_uid=f"uid-{a.pk}",
                started_at=hour,
                ended_at=hour + timedelta(minutes=5),
            )
            for a in allocations
        ],
        2000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _conditions(node: dict) -> str:
    """The index conditions a scan node (and its bitmap children) searches by."""
    return " ".join(n.get("Index Cond", "") for n in _nodes(node))


def _plan_problems(sql: str, table: str, sizes: dict[str, int]) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        (raw,) = cursor.fetchone()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    problems = []
    for node in _nodes(plan):
        relation = node.get("Relation Name")
        if relation is None:
            continue
        if node["Node Type"] == "Seq Scan" and sizes.get(relation, 0) > BIG:
            problems.append(f"Seq Scan on {relation} ({sizes[relation]} rows)")
        if relation == table and "project_id" not in _conditions(node):
            problems.append(f"{node['Node Type']} on {table} without a project index condition: {node}")
    return problems


@pytest.mark.postgres
@pytest.mark.django_db
def test_every_member_list_starts_from_the_members_projects():
    keys = build_api_world(OTHER_PROJECTS + MEMBER_PROJECTS, MEMBER_PROJECTS)
    _add_history()
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reltuples::bigint FROM pg_class WHERE relkind = 'r'")
        sizes = dict(cursor.fetchall())
    assert sizes["pools_poolrequest"] > 2 * OTHER_PROJECTS  # ANALYZE saw the world

    client = APIClient(SERVER_NAME="127.0.0.1")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {keys['member']}")
    client.get("/api/v1/projects/")  # the token's first use records last_used_at
    problems = {}
    for path, table in MEMBER_LISTS.items():
        with CaptureQueriesContext(connection) as captured:
            response = client.get(path, {"page_size": 50})
        assert response.status_code == 200, (path, response.content[:300])
        body = response.json()
        rows = body if isinstance(body, list) else body["results"]
        if path != "/api/v1/pool-requests/queue/":  # nobody waits in this world
            assert rows, f"{path}: the member's own rows are listed"
        reading = [q["sql"] for q in captured if f'FROM "{table}"' in q["sql"]]
        assert reading or not rows, f"{path}: no query read {table}"
        for sql in reading:
            if found := _plan_problems(sql, table, sizes):
                problems.setdefault(path, []).extend(found)
    assert problems == {}


@pytest.mark.django_db
def test_a_members_project_ids_are_read_as_a_list_and_a_huge_set_stays_a_subquery(monkeypatch):
    User = get_user_model()
    member = User.objects.create_user("member")
    projects = [Project.objects.create(name=f"P{i}", slug=f"p{i}", namespace=f"p{i}") for i in range(3)]
    Project.objects.create(name="Other", slug="other", namespace="other")
    for project in projects[:2]:
        roles.set_role(project, member, Role.MEMBER)

    assert roles.project_id_list_for(member) == sorted(p.pk for p in projects[:2])
    assert roles.project_id_list_for(User.objects.create_superuser("root", "", "x")) is None

    monkeypatch.setattr(roles, "PROJECT_ID_LIST_MAX", 1)
    as_subquery = roles.project_id_list_for(member)
    assert not isinstance(as_subquery, list)
    assert sorted(Project.objects.filter(pk__in=as_subquery).values_list("pk", flat=True)) == sorted(
        p.pk for p in projects[:2]
    )


def test_usernames_only_defers_every_user_column_but_the_username():
    deferred = usernames_only("requested_by")
    assert "requested_by__password" in deferred and "requested_by__email" in deferred
    assert "requested_by__username" not in deferred and "requested_by__id" not in deferred


@pytest.mark.django_db
def test_a_members_pool_request_page_reads_no_password():
    User = get_user_model()
    member = User.objects.create_user("member")
    project = Project.objects.create(name="P", slug="p", namespace="p")
    roles.set_role(project, member, Role.MEMBER)
    PoolRequest.objects.create(project=project, requested_by=member, product="H100-80GB", count=1)
    client = APIClient()
    client.force_authenticate(member)
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/api/v1/pool-requests/")
    assert response.status_code == 200
    assert response.json()["results"][0]["requested_by"] == "member"
    page = [q["sql"] for q in captured if 'FROM "pools_poolrequest"' in q["sql"] and "COUNT(" not in q["sql"]]
    assert page and all('"password"' not in sql for sql in page)
