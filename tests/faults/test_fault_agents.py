"""Scale-out: node agents (no database) serving many simulated nodes' queues, ingest workers, both killed mid-cycle.

Three agent processes (GPUAAS_ROLE=node-agent, DATABASE_URL unset) each serve a third of the
simulated nodes' queues; two `manage.py ingest-worker` processes write the reports. In the first
cycle an agent SIGKILLs itself after reading a node (before publishing) and an ingest worker after
committing a batch (before acknowledging it); both are replaced, as their DaemonSet and Deployment
would. The killed ingest worker's batch comes back after AGENT_INGEST_VISIBILITY_S and is written
again without a second row. The next cycle is complete and no (ts, series) has two rows.
"""

from __future__ import annotations

import time

import pytest
from conftest import purge

from benchmarks.capacity import _serve
from benchmarks.monitoring.poll_cycle import (
    PollFleet,
    _discover,
    duplicated,
    expected_units,
    run_cycle,
    split_queues,
    wait_for_slot_boundary,
    wait_ready,
    written,
)
from capacity.agent import transport
from capacity.models import Cluster, NodeCapacity
from monitoring.models import Collector, Sample

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

PERIOD_S = 10


def _purge_ingest(queues: list[str]) -> None:
    purge(queues)
    transport.purge()


def test_agents_and_ingest_workers_killed_mid_cycle_lose_nothing_in_the_next_cycle(tmp_path, settings):
    settings.METRICS_INTERVAL_S, settings.METRICS_REPOLL_AFTER_S = PERIOD_S, PERIOD_S * 2 // 3
    server, kubeconfig = _serve(12, 2, tmp_path)
    fleet = None
    try:
        cluster = Cluster.objects.create(name="scale", kubeconfig_path=str(kubeconfig))
        _discover(cluster, server)
        names = list(
            NodeCapacity.objects.present().filter(cluster=cluster).order_by("name").values_list("cluster__name", "name")
        )
        queues = split_queues(names, 3)
        _purge_ingest([q for share in queues for q in share])
        markers = tmp_path / "crashed"
        markers.mkdir()
        fleet = PollFleet(
            tmp_path / "logs",
            queues=queues,
            workers=2,
            threads=2,
            env={
                "METRICS_INTERVAL_S": str(PERIOD_S),
                "AGENT_INGEST_VISIBILITY_S": "5",
                "AGENT_INGEST_BATCH": "4",  # several batches per cycle: the killed one is one of them
                "GPUAAS_VAR_DIR": str(tmp_path / "var"),
                "GPUAAS_CRASH_AT": "agent.read,ingest.committed",
                "GPUAAS_CRASH_MARKER_DIR": str(markers),
            },
        )
        fleet.start()
        wait_ready(fleet, timeout_s=180)
        expected = expected_units(cluster)

        wait_for_slot_boundary(PERIOD_S)
        killed = run_cycle(cluster, expected, deadline_s=PERIOD_S, during=lambda _: fleet.replace_dead())
        assert sorted(p.name for p in markers.iterdir()) == ["agent.read", "ingest.committed"], fleet.log_tail()
        assert fleet.exit_codes == [-9, -9]
        # The killed ingest worker's batch was committed before the kill: redelivered, it adds no row.
        time.sleep(6)  # past AGENT_INGEST_VISIBILITY_S: the redelivery has been consumed
        assert written(cluster, killed["ts"]) <= expected
        assert duplicated(cluster, killed["ts"]) == 0

        wait_ready(fleet, timeout_s=180)
        wait_for_slot_boundary(PERIOD_S)
        after = run_cycle(cluster, expected, deadline_s=3 * PERIOD_S)
        assert (after["samples"], after["lost"], after["duplicated"]) == (expected, 0, 0), fleet.log_tail()
        assert fleet.exit_codes == [-9, -9]  # nothing else died
        # Collectors are upserted after a batch's samples commit: the last batch's may lag the samples briefly.
        deadline = time.monotonic() + 30
        while Collector.objects.filter(cluster=cluster).count() < len(names) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert Collector.objects.filter(cluster=cluster).count() == len(names)  # one per node, never two
        assert Sample.objects.filter(ts=after["ts"]).count() == expected
    finally:
        if fleet is not None:
            fleet.stop()
        server.stop()
        _purge_ingest([])
