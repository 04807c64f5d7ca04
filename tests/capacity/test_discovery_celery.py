"""Discovery and the node agents' inventory through a real broker (Redis), a real worker and the ingest worker."""

import time

import pytest
from celery.contrib.testing.worker import start_worker

from capacity.agent import transport
from capacity.models import DiscoveryRun, GpuCapacity, NodeCapacity
from capacity.tasks import discover_cluster_task
from core.celery import app, node_queue
from monitoring.ingest.worker import IngestWorker

pytestmark = [
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("retry_waits"),
]

NODES = ["dev-h200-ts-01", "dev-h200-ts-02"]


def purge(queues):
    with app.connection_for_write() as conn:
        for queue in queues:
            conn.default_channel.queue_purge(queue)
    transport.purge()


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_discovery_then_node_inventory_through_the_broker(simcluster):
    sim = simcluster("demo")
    dev = sim.register("dev")["dev"]
    queues = ["discovery", *(node_queue("dev", n) for n in NODES)]
    purge(queues)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, queues=queues, shutdown_timeout=10):
            discover_cluster_task.delay(dev.pk)
            # The agents' two signed reports, written by one batch of the ingest worker.
            IngestWorker(batch=2, linger_ms=5000).run(max_batches=1)
            assert wait_for(lambda: GpuCapacity.objects.filter(node__cluster=dev).count() == 16)
    finally:
        purge(queues)
    run = DiscoveryRun.objects.get(cluster=dev)
    assert (run.status, run.nodes_seen, run.gpus_seen) == ("succeeded", 2, 16)
    assert run.task_id  # the worker's task id is recorded on the run
    assert sorted(NodeCapacity.objects.filter(cluster=dev).values_list("name", flat=True)) == NODES
    assert set(GpuCapacity.objects.filter(node__cluster=dev).values_list("catalog_product", flat=True)) == {
        "H200-141GB"
    }
