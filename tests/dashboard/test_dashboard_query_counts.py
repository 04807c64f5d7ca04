"""The dashboard JSON and the project view run a fixed number of queries, however big the fleet."""

from datetime import timedelta

import pytest
from dashboard_world import _gpu, _instance, _node, add_signals
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

pytestmark = pytest.mark.django_db

# Measured on this world; the point is they do not move when the fleet grows (checked below).
# 2 of them read the session and the user; a multi-device pod adds up to 2 (resolving its device UUIDs);
# 1 (2 on the node view: its tiles' labels and the rules listed) reads the tier profile policies.
# 1 sums the held units' shares of a GPU (Allocation.objects.counted); 1 reads the rate cards the month's
# showback is priced with (billing.services.lines groups usage by card, then prices each card once); 7 the
# capacity plan per tier (capacity.services.planning.tier_plan, given the busy devices, the policies and the MIG
# instances' counts, which the cards and the plan share); 2 the rolling upgrades under way and their clusters'
# maintenance windows (gpuaas.dashboard.upgrades). The node view reads its page's GPU ids and MIG instance ids
# first (2), so that each availability query reads the holders of those units only (bench fleet, issue 28).
OVERVIEW_MAX = 32
CLUSTER_MAX = 23
# 2 of them read the trespass panel, 1 the pools' clusters (units per cluster), 1 best-effort requests, 1 the
# pools' held units (their shares of a GPU), 1 the member's project ids (tenancy.roles.project_ids_of: read once
# per request, then literals in every list's SQL).
PROJECT_LIST_MAX = 15
# 10 of them read the monitoring tab's series (monitoring.readers), 4 of those the raw samples after the last
# finished rollup; 1 reads the pool's clusters, 1 its held units (their shares of a GPU). The pods section
# (monitoring.readers.pool_pods) adds up to 7 whatever the number of pods: the pool's units, their series, the
# rollup progress, the project's pods, their units' rollups and the raw samples after them (2 on PostgreSQL).
POOL_PAGE_MAX = 27
# The readers add queries for the raw samples after the last finished 5-minute rollup, when there are any:
# the world is built with its fresh sample a bucket back, so that tail is there on every run (the worst case),
# and a slow run cannot cross a bucket boundary half-way through.
SIGNALS_AGO = timedelta(minutes=5, seconds=10)


def _grow(world, nodes=3):
    """More nodes, GPUs and MIG instances on both clusters."""
    for cluster in (world.alpha, world.beta):
        for n in range(nodes):
            node = _node(cluster, f"{cluster.name}-x{n}", "NVIDIA H100 80GB HBM3", 2)
            _gpu(node, 0, "NVIDIA H100 80GB HBM3", "H100-80GB", False)
            mig = _gpu(node, 1, "NVIDIA H100 80GB HBM3", "H100-80GB", True)
            _instance(mig, "3g.40gb", 0)
            _instance(mig, "1g.10gb", 4)


def _count(client, url):
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


@pytest.mark.parametrize(
    ("url", "bound", "user"),
    [
        ("/admin/dashboard/data.json", OVERVIEW_MAX, "operator"),
        ("/admin/dashboard/", OVERVIEW_MAX, "operator"),
        ("cluster", CLUSTER_MAX, "operator"),
        ("/projects/", PROJECT_LIST_MAX, "bob"),
        ("pool", POOL_PAGE_MAX, "bob"),
    ],
)
def test_query_count_is_bounded_and_independent_of_fleet_size(
    client, django_assert_max_num_queries, world, operator, bob, url, bound, user
):
    add_signals(world, now=timezone.now() - SIGNALS_AGO)
    url = {
        "cluster": f"/admin/dashboard/clusters/{world.alpha.pk}/data.json",
        "pool": f"/projects/team-a/pools/{world.pools['inference'].pk}/",
    }.get(url, url)
    client.force_login({"operator": operator, "bob": bob}[user])
    client.get(url)  # warm the session and content-type caches
    with django_assert_max_num_queries(bound):
        assert client.get(url).status_code == 200
    before = _count(client, url)
    _grow(world)
    assert _count(client, url) == before
