"""Node agents' signed reports: the control plane writes a node's readings only when that node signed them.

The agent's read (capacity.agent.node.read_metrics) runs against the simulator in this process; the
ingest (monitoring.services.reports.ingest_reports) is what the ingest worker calls with a batch.
A node agent process has no database: its settings install Django's dummy engine (any query raises).
"""

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import pytest
from monitoring_sim import start

from capacity.adapters import kubernetes as kube
from capacity.adapters import nvml
from capacity.agent import node as agent
from capacity.agent import protocol
from monitoring.models import Collector, Sample
from monitoring.services import reports
from monitoring.services.collect import poll_slot

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sim(tmp_path):
    sim = start(tmp_path)
    yield sim
    sim.server.stop()


def _read(sim, node: str, slot: int | None = None) -> dict:
    slot = slot if slot is not None else int(poll_slot().timestamp())
    return agent.read_metrics(sim.name, node, api_url=kube.api_url_for(sim.cluster), slot=slot)


def test_a_batch_of_two_nodes_is_written_in_one_sample_insert(sim):
    slot = int(poll_slot().timestamp())  # both reads in one slot, even when a slot boundary falls between them
    batch = [_read(sim, "h100-01", slot), _read(sim, "a100-01", slot)]
    with mock.patch.object(reports, "write_samples", wraps=reports.write_samples) as write:
        outcome = reports.ingest_reports(batch)
    assert write.call_count == 1  # one slot: every node's samples in one insert (a COPY above 200 rows)
    assert (outcome.samples, outcome.refused) == (5 + 3, [])
    assert Sample.objects.count() == 8
    assert sorted(Collector.objects.values_list("target", "last_samples", "last_error")) == [
        ("a100-01", 3, ""),
        ("h100-01", 5, ""),
    ]


def test_a_redelivered_batch_writes_nothing_twice(sim):
    batch = [_read(sim, "h100-01"), _read(sim, "a100-01")]
    reports.ingest_reports(batch)
    rows = sorted(Sample.objects.values_list("ts", "series_id"))
    again = reports.ingest_reports(json.loads(json.dumps(batch)))  # as the broker hands it back
    assert again.refused == []
    assert sorted(Sample.objects.values_list("ts", "series_id")) == rows


def test_a_report_signed_with_another_nodes_key_is_refused_and_writes_nothing(sim, settings):
    genuine = _read(sim, "a100-01")
    forged = {**genuine, "node": "h100-01"}  # a100-01's agent claims to be h100-01
    outcome = reports.ingest_reports([forged])
    assert outcome.refused == [f"{sim.name}/h100-01: signature does not match node {sim.name}/h100-01"]
    assert (Sample.objects.count(), Collector.objects.count()) == (0, 0)

    # An agent holding only its own node's key cannot sign for another node at all.
    settings.AGENT_NODE_KEY = protocol.node_key(settings.AGENT_SIGNING_SECRET, sim.name, "a100-01").hex()
    settings.AGENT_CLUSTER_NAME, settings.AGENT_NODE_NAME = sim.name, "a100-01"
    with pytest.raises(protocol.BadReport, match="holds the key of"):
        _read(sim, "h100-01")
    own = _read(sim, "a100-01")
    assert reports.ingest_reports([own]).refused == []  # signed with its own key: accepted
    assert Sample.objects.count() == 3


def test_tampered_stale_or_malformed_reports_are_refused(sim):
    slot = int(poll_slot().timestamp())
    tampered = _read(sim, "h100-01", slot)
    tampered["body"]["gpus"][0]["power_w"] = 1.0
    stale = _read(sim, "h100-01", slot - 3600)  # older than MONITORING_ROLLUP_LATENESS_S
    future = _read(sim, "h100-01", slot + 3600)
    unknown_node = protocol.sign("metrics", sim.name, "no-such-node", slot, protocol.metrics_body([]))
    outcome = reports.ingest_reports([tampered, stale, future, unknown_node, "junk", {"v": 1}])
    assert [reason.split(": ", 1)[1] for reason in outcome.refused] == [
        f"signature does not match node {sim.name}/h100-01",
        f"slot {slot - 3600} is past the lateness window (MONITORING_ROLLUP_LATENESS_S=600)",
        f"slot {slot + 3600} is in the future",
        "not a report object",
        "not a report object",
        "not a present node of that cluster",
    ]
    assert Sample.objects.count() == 0


def test_an_nvml_failure_is_recorded_on_the_collector(sim):
    sim.server.stop()  # the simulated node's NVML no longer answers
    result = reports.ingest_reports([_read(sim, "h100-01")]).results[sim.node("h100-01").pk]
    collector = Collector.objects.get(target="h100-01")
    assert result.error and collector.last_error == result.error and collector.last_success_at is None
    assert Sample.objects.count() == 0


def test_a_node_agent_process_reads_and_signs_without_a_database(sim):
    """GPUAAS_ROLE=node-agent with DATABASE_URL unset: NVML works, the ORM raises."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(GPUAAS_ROLE="node-agent", DJANGO_SETTINGS_MODULE="gpuaas.settings_test")
    script = (
        "import django, json, sys; django.setup()\n"
        "from capacity.agent import node\n"
        "from capacity.models import Cluster\n"
        "report = node.read_metrics(sys.argv[1], 'h100-01', api_url=sys.argv[2], slot=int(sys.argv[3]))\n"
        "try:\n    Cluster.objects.count()\nexcept Exception as exc:\n    report['orm'] = type(exc).__name__\n"
        "print(json.dumps(report))\n"
    )
    slot = int(poll_slot().timestamp())
    done = subprocess.run(
        [sys.executable, "-c", script, sim.name, kube.api_url_for(sim.cluster), str(slot)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.pop("orm") == "ImproperlyConfigured"
    outcome = reports.ingest_reports([report])
    assert (outcome.refused, outcome.samples) == ([], 5)
    assert Sample.objects.filter(ts=datetime.fromtimestamp(slot, tz=UTC)).count() == 5


def test_readings_travel_exactly_as_dataclasses_asdict_would_give_them(sim):
    readings = nvml.node_metrics(kube.api_url_for(sim.cluster), "h100-01")
    assert any(r.mig for r in readings) and any(r.processes or r.xids is not None for r in readings)
    gpus = protocol.metrics_body(readings)["gpus"]
    assert gpus == [dataclasses.asdict(r) for r in readings]
    assert [list(g) for g in gpus] == [list(dataclasses.asdict(r)) for r in readings]  # same key order
    assert protocol.metrics_from_body(json.loads(json.dumps(protocol.metrics_body(readings))))[0] == readings
