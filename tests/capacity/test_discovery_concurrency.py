"""Duplicated discovery and inventory running at the same time never duplicate rows (real PostgreSQL)."""

import threading

import pytest
from django.db import connection

from capacity.models import DiscoveryRun, GpuCapacity, MigInstance, NodeCapacity, SpecAndCount, WorkloadProfile
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import inventory_node

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("retry_waits"),
]


def together(*calls):
    """Run the calls in threads released at the same moment; re-raise the first error."""
    barrier = threading.Barrier(len(calls))
    results, errors = [None] * len(calls), []

    def run(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def counts(cluster):
    return (
        NodeCapacity.objects.filter(cluster=cluster).count(),
        SpecAndCount.objects.filter(node__cluster=cluster).count(),
        GpuCapacity.objects.filter(node__cluster=cluster).count(),
        MigInstance.objects.filter(gpu__node__cluster=cluster).count(),
        WorkloadProfile.objects.filter(cluster=cluster).count(),
    )


def test_two_discoveries_of_one_cluster_at_once_write_each_row_once(simcluster):
    sim = simcluster("demo")
    prod = sim.register("prod")["prod"]
    outcomes = together(*[lambda: discover_cluster(prod.pk, inventory="inline")] * 2)
    assert [o.run.status for o in outcomes] == ["succeeded", "succeeded"]
    assert counts(prod) == (6, 16, 48, 104, 5)
    assert DiscoveryRun.objects.filter(cluster=prod).count() == 2
    again = together(*[lambda: discover_cluster(prod.pk, inventory="inline")] * 3)
    assert [o.run.status for o in again] == ["succeeded"] * 3
    assert counts(prod) == (6, 16, 48, 104, 5)


def test_duplicated_inventory_tasks_of_one_node_at_once(simcluster):
    sim = simcluster("demo")
    prod = sim.register("prod")["prod"]
    assert discover_cluster(prod.pk, inventory="none").run.status == "succeeded"
    results = together(*[lambda: inventory_node(prod.pk, "prod-h100-bal-02")] * 3)
    assert [r.errors for r in results] == [{}, {}, {}]
    assert GpuCapacity.objects.filter(node__name="prod-h100-bal-02").count() == 8
    assert MigInstance.objects.filter(gpu__node__name="prod-h100-bal-02").count() == 32
    assert sum(r.gpus_written for r in results) == 8  # the ones that came second found nothing to write
