"""The big admin changelists: a fixed number of queries whatever the fleet, and no COUNT(*) over a big table.

On PostgreSQL a changelist above core.admin_paging.ESTIMATE_ABOVE rows takes the planner's estimate
(pg_class.reltuples unfiltered, EXPLAIN filtered) and says "about N"; on SQLite, and below the threshold,
the count is exact.
"""

import pytest
from dashboard_world import _gpu, _instance, _node
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from capacity.models import GpuCapacity
from core import admin_paging

pytestmark = pytest.mark.django_db

CHANGELISTS = [
    "admin:capacity_gpucapacity_changelist",
    "admin:capacity_nodecapacity_changelist",
    "admin:capacity_miginstance_changelist",
    "admin:capacity_allocation_changelist",
    "admin:pools_poolrequest_changelist",
    "admin:billing_usagerecord_changelist",
    "admin:billing_statement_changelist",
    "admin:monitoring_trespassevent_changelist",
    "admin:monitoring_series_changelist",
    "admin:monitoring_healthevent_changelist",
    "admin:pools_gpupool_changelist",
    "admin:tenancy_project_changelist",
    "admin:notifications_event_changelist",
    "admin:notifications_delivery_changelist",
]
# Tables that grow with the fleet (units, nodes) or with history (one row or more per request, allocation,
# hour, event): their changelists must page by estimate (core.admin_paging.FleetScaleAdminMixin).
FLEET_SIZED = [
    "capacity.NodeCapacity",
    "capacity.GpuCapacity",
    "capacity.MigInstance",
    "capacity.WorkloadProfile",
    "capacity.DiscoveryRun",
    "pools.GpuPool",
    "pools.PoolRequest",
    "capacity.Allocation",
    "billing.UsageRecord",
    "billing.Statement",
    "monitoring.TrespassEvent",
    "monitoring.Series",
    "monitoring.HealthEvent",
    "tenancy.Project",
    "notifications.Event",
    "notifications.Delivery",
]


def _grow(world, nodes=3):
    for cluster in (world.alpha, world.beta):
        for n in range(nodes):
            node = _node(cluster, f"{cluster.name}-y{n}", "NVIDIA H100 80GB HBM3", 2)
            _gpu(node, 0, "NVIDIA H100 80GB HBM3", "H100-80GB", False)
            mig = _gpu(node, 1, "NVIDIA H100 80GB HBM3", "H100-80GB", True)
            _instance(mig, "3g.40gb", 0)
            _instance(mig, "1g.10gb", 4)


def _get(client, url):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return response, [q["sql"] for q in queries.captured_queries]


def _counts_table(sql: list[str], table: str) -> bool:
    return any("COUNT(" in q.upper() and f'FROM "{table}"' in q for q in sql)


def _paginator_text(response) -> str:
    html = response.content.decode().split('<p class="paginator">', 1)[1].split("</p>", 1)[0]
    return " ".join(html.replace(">", "> ").split())


def _analyze(table: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f'ANALYZE "{table}"')


@pytest.mark.parametrize("label", FLEET_SIZED)
def test_every_fleet_sized_changelist_pages_by_estimate(label):
    from django.apps import apps
    from django.contrib import admin

    model_admin = admin.site._registry[apps.get_model(label)]
    assert isinstance(model_admin, admin_paging.FleetScaleAdminMixin)
    assert model_admin.paginator is admin_paging.EstimatedCountPaginator
    assert model_admin.show_full_result_count is False


@pytest.mark.parametrize("url_name", CHANGELISTS)
def test_changelist_queries_do_not_grow_with_the_fleet(client, operator, world, url_name):
    client.force_login(operator)
    url = reverse(url_name)
    client.get(url)  # warm the session and content-type caches
    before = len(_get(client, url)[1])
    _grow(world)
    assert len(_get(client, url)[1]) == before


def test_a_small_table_is_counted_exactly(client, operator, world):
    client.force_login(operator)
    response, _ = _get(client, reverse("admin:capacity_gpucapacity_changelist"))
    paginator = response.context_data["cl"].paginator
    assert paginator.estimated is False
    assert paginator.count == GpuCapacity.objects.count()
    assert "about" not in _paginator_text(response)


def test_sqlite_never_estimates(client, operator, world, monkeypatch):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's behaviour")
    monkeypatch.setattr(admin_paging, "ESTIMATE_ABOVE", 0)
    client.force_login(operator)
    response, sql = _get(client, reverse("admin:capacity_gpucapacity_changelist"))
    paginator = response.context_data["cl"].paginator
    assert (paginator.estimated, paginator.count) == (False, GpuCapacity.objects.count())
    assert _counts_table(sql, GpuCapacity._meta.db_table)


@pytest.mark.postgres
def test_postgresql_estimates_an_unfiltered_big_list_from_the_table_statistics(client, operator, world, monkeypatch):
    monkeypatch.setattr(admin_paging, "ESTIMATE_ABOVE", 2)
    table = GpuCapacity._meta.db_table
    _analyze(table)
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table])
        reltuples = cursor.fetchone()[0]
    client.force_login(operator)
    response, sql = _get(client, reverse("admin:capacity_gpucapacity_changelist"))

    paginator = response.context_data["cl"].paginator
    assert (paginator.estimated, paginator.count) == (True, reltuples)
    assert reltuples == GpuCapacity.objects.count()  # just analysed: the estimate is the truth here
    assert not _counts_table(sql, table)  # no COUNT(*) scan
    assert any("pg_class" in q for q in sql)
    assert f"about {reltuples} " in _paginator_text(response)


@pytest.mark.postgres
def test_postgresql_estimates_a_filtered_big_list_with_explain(client, operator, world, monkeypatch):
    monkeypatch.setattr(admin_paging, "ESTIMATE_ABOVE", 0)
    _analyze(GpuCapacity._meta.db_table)
    client.force_login(operator)
    response, sql = _get(client, reverse("admin:capacity_gpucapacity_changelist") + "?mig_mode_current__exact=1")

    paginator = response.context_data["cl"].paginator
    assert paginator.estimated is True and paginator.count >= 1
    assert any(q.startswith("EXPLAIN") for q in sql)
    assert not _counts_table(sql, GpuCapacity._meta.db_table)


@pytest.mark.postgres
def test_postgresql_counts_exactly_below_the_threshold(client, operator, world):
    _analyze(GpuCapacity._meta.db_table)
    client.force_login(operator)
    response, sql = _get(client, reverse("admin:capacity_gpucapacity_changelist"))
    paginator = response.context_data["cl"].paginator
    assert (paginator.estimated, paginator.count) == (False, GpuCapacity.objects.count())
    assert _counts_table(sql, GpuCapacity._meta.db_table)


@pytest.mark.postgres
def test_the_approval_queue_pages_from_its_index(world):
    """The pool-request changelist's PENDING_FIRST order is PoolRequest's expression index, so a page reads
    its rows from it instead of sorting every request (the planner is told to avoid sorting to show it can)."""
    from pools.models import PENDING_FIRST, PoolRequest

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("SET LOCAL enable_seqscan = off")
    plan = PoolRequest.objects.order_by(*PENDING_FIRST)[:100].explain()
    assert "pools_request_pending_first" in plan and "Sort" not in plan


@pytest.mark.postgres
def test_the_trespass_list_pages_from_its_index(world):
    """TrespassEvent's default order (newest first) has its own index, so a page does not sort every event."""
    from monitoring.models import TrespassEvent

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("SET LOCAL enable_seqscan = off")
    plan = TrespassEvent.objects.all()[:100].explain()
    assert "monitoring_trespass_recent" in plan and "Sort" not in plan
