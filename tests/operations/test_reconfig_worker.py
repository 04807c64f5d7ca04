"""One real worker against Redis: every step is a message, waiting steps re-enqueue with a countdown.

The worker serves the control plane's default queue and the node's queue (where only node-agent tasks
arrive: the agent backend's MIG command, both backends' inventory reads); an ingest worker in a thread
writes the inventory reports the node's agent publishes."""

import threading
import time

import pytest
from django.db import connections
from reconfig_sim import node_row, start_sim

from capacity.agent import transport
from monitoring.ingest.worker import IngestWorker
from operations import reconfiguration as rc

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]


def wait_for(reconf, timeout_s: float = 90.0):
    """Poll the row until the workflow ends (a bound on waiting, not an assertion on time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reconf.refresh_from_db()
        if reconf.state in ("succeeded", "failed"):
            return reconf
        time.sleep(0.2)
    return reconf


def consume(ingest: IngestWorker) -> None:
    try:
        ingest.run()
    finally:
        connections.close_all()  # this thread's own: the test database is dropped after the test


@pytest.mark.parametrize("backend", ["operator", "agent"])
def test_a_real_worker_runs_the_whole_workflow(tmp_path, settings, backend):
    from celery.contrib.testing.worker import start_worker

    from core.celery import app, node_queue

    settings.MIG_RECONFIG_POLL_S = 1
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")], mig_manager_delay=0.2)
    queues = ["default", node_queue(sim.cluster.name, "gpu-a")]
    ingest = IngestWorker(batch=1, linger_ms=0)
    consumer = threading.Thread(target=consume, args=(ingest,))
    try:
        with app.connection_for_write() as connection:
            for queue in queues:
                connection.default_channel.queue_purge(queue)
        transport.purge()
        consumer.start()
        with start_worker(
            app, pool="threads", concurrency=2, queues=queues, perform_ping_check=False, shutdown_timeout=10
        ):
            reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"], "1": ["2g.20gb"] * 3}, backend=backend, force=True)
            wait_for(reconf)
    finally:
        ingest.stop()
        if consumer.is_alive():
            consumer.join(10)
        sim.server.stop()

    assert reconf.state == "succeeded", reconf.error
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]
    assert sim.layout("gpu-a", 1) == [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4)]
    completed = list(reconf.steps.filter(event="completed").order_by("at", "id").values_list("step", flat=True))
    assert completed == ["plan", "check", "cordon", "drain", "apply", "verify", "uncordon"]
    assert all(s.task_id not in ("", "local") for s in reconf.steps.filter(event="completed"))
    assert sim.node("gpu-a").unschedulable is False
    if backend == "operator":  # verify waited for the agent's inventory read after the MIG manager's success
        assert node_row("gpu-a").inventory_read_since(reconf.applied_at)
