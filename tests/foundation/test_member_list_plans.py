"""A member's list pages start from the member's own projects, whatever the rest of the fleet holds.

The PostgreSQL test builds bench api's world (tenancy.roles.in_projects_of, core.permissions.
ProjectScopedQuerysetMixin): thousands of other projects with requests, pools, allocations, usage,
statements and trespass events, and a member of a few of the oldest projects (the worst case for a
plan that walks the newest rows and filters). Each member list is requested through the API, and every
query it ran is EXPLAINed: no history table may be read whole (Seq Scan) and the list's own table must
be reached through an index condition on its project column, so a plan regression fails here rather than
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
from capacity.models import Cluster
from core.api import usernames_only
from monitoring.choices import TrespassKind
from monitoring.models import TrespassEvent
from pools.models import Allocation, GpuPool, PoolRequest
from tenancy import roles
from tenancy.choices import Role
from tenancy.models import Project

OTHER_PROJECTS = 3000
MEMBER_PROJECTS = 3
REQUESTS_PER_MEMBER_PROJECT = 30  # the member's history fills more than a page of 50
RELEASED_POOLS_PER_OTHER_PROJECT = 5  # others' history: released requests and their pools
BIG = 1000  # a history table with more rows than this is never read whole by a member's list
# ... except a table joined to the member's rows: with the project ids as literals the planner knows it has
# about a hundred of them, and at this world's size hashing a joined table of ~20,000 rows (3 ms) is cheaper
# than a hundred index probes. At fleet size it probes (bench fleet, issue 28); a table this big read whole
# would still fail.
JOINED_BIG = 100_000
# Tables that grow with history (every project's requests, pools, units, hours, months, events). Users
# and projects are the fleet itself: with 3,000 of them a hash join may still read them whole.
HISTORY = {
    "pools_poolrequest",
    "pools_gpupool",
    "pools_allocation",
    "billing_statement",
    "billing_usagerecord",
    "monitoring_trespassevent",
    "pools_queueentry",
    "pools_poolcluster",
}

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
    """Usage hours, a statement and a trespass event for every project's allocation, and more than a
    page of old requests for the member's projects, the oldest rows of all (bulk inserts)."""
    hour = datetime(2026, 11, 1, tzinfo=UTC)
    old = datetime(2020, 1, 1, tzinfo=UTC)
    theirs = Project.objects.order_by("id")[:MEMBER_PROJECTS]  # build_api_world's member projects
    PoolRequest.objects.bulk_create(
        [
            PoolRequest(project=p, state="released", product="H100-80GB", count=1, created_at=old + timedelta(hours=i))
            for p in theirs
            for i in range(REQUESTS_PER_MEMBER_PROJECT)
        ]
    )
    others = list(Project.objects.order_by("id")[MEMBER_PROJECTS:])
    cluster = Cluster.objects.get(name="bench")
    released = PoolRequest.objects.bulk_create(
        [
            PoolRequest(project=p, state="released", product="H100-80GB", count=1)
            for p in others
            for _ in range(RELEASED_POOLS_PER_OTHER_PROJECT)
        ],
        2000,
    )
    GpuPool.objects.bulk_create(
        [
            GpuPool(
                project_id=r.project_id,
                request=r,
                cluster=cluster,
                name=f"old-{r.pk}",
                workload_type="training",
                tier="full",
                state="released",
            )
            for r in released
        ],
        2000,
    )
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
        whole = BIG if relation == table else JOINED_BIG
        if node["Node Type"] == "Seq Scan" and relation in HISTORY and sizes.get(relation, 0) > whole:
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
def test_in_projects_of_keeps_the_rows_of_the_users_projects():
    User = get_user_model()
    member = User.objects.create_user("member")
    projects = [Project.objects.create(name=f"P{i}", slug=f"p{i}", namespace=f"p{i}") for i in range(3)]
    roles.set_role(projects[0], member, Role.MEMBER)
    roles.set_role(projects[1], member, Role.VIEWER)
    for project in projects:
        PoolRequest.objects.create(project=project, product="H100-80GB", count=1)

    with CaptureQueriesContext(connection) as reading:
        mine = PoolRequest.objects.filter(roles.in_projects_of(member))
    assert len(reading) == 1  # the member's project ids, read before the list
    with CaptureQueriesContext(connection) as captured:
        assert sorted(mine.values_list("project_id", flat=True)) == [projects[0].pk, projects[1].pk]
    assert len(captured) == 1
    if connection.vendor == "postgresql":  # the ids are constants the planner can count, not a subquery
        assert "= ANY('{" in captured[0]["sql"] and "permission" not in captured[0]["sql"]
    assert not Project.objects.filter(roles.in_projects_of(User.objects.create_user("nobody"), "pk")).exists()
    assert roles.in_projects_of(User.objects.create_superuser("root", "", "x")) is None  # operators: every row


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
