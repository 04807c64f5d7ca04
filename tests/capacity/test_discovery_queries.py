"""The number of SQL queries of discovery does not grow with the number of nodes."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from capacity.models import NodeCapacity
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import inventory_nodes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


def counted(fn):
    with CaptureQueriesContext(connection) as queries:
        result = fn()
    return result, len(queries)


def measure(simcluster, nodes: int) -> dict:
    sim = simcluster("scale", nodes=nodes, gpus_per_node=2)
    cluster = sim.register("scale", prefix=f"n{nodes}-")["scale"]
    first = discover_cluster(cluster.pk, inventory="inline")
    assert first.run.status == "succeeded"
    assert NodeCapacity.objects.filter(cluster=cluster).count() == nodes
    resync, resync_queries = counted(lambda: discover_cluster(cluster.pk, inventory="none"))
    assert (resync.sync.nodes_updated, resync.sync.specs_written, resync.sync.workloads.updated) == (0, 0, 0)
    names = list(NodeCapacity.objects.filter(cluster=cluster).values_list("name", flat=True))
    inventory, inventory_queries = counted(lambda: inventory_nodes(cluster.pk, names, api_url=sim.url("scale")))
    assert (inventory.gpus_written, inventory.mig_written) == (0, 0)
    return {"resync": resync_queries, "inventory": inventory_queries}


def test_a_no_change_resync_costs_the_same_queries_at_5_and_20_nodes(simcluster):
    small, large = measure(simcluster, 5), measure(simcluster, 20)
    assert small == large
    assert small["resync"] <= 10
