"""Poll cycles degrade, never collapse (#28): late work is kept while it is still useful, and counted when not.

- A report that arrives after its period is written while its slot is within MONITORING_ROLLUP_LATENESS_S,
  and the rollups pick it up; written again (a redelivery), it adds nothing.
- A report past the lateness window is dropped, and its samples are counted on the node's collector.
- A node read that has not started when its period ends is dropped by its agent (the message's expiry); one
  that has started is finished and its report published, however long it takes.
"""

import time
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from celery.contrib.testing.mocks import TaskMessage
from celery.worker.request import Request
from monitoring_sim import start

from capacity.adapters import kubernetes as kube
from capacity.agent import node as agent
from capacity.agent import transport
from capacity.agent.tasks import read_node_metrics_task
from core.celery import app
from monitoring.buckets import BUCKET, ceil
from monitoring.ingest.worker import IngestWorker
from monitoring.models import Collector, Rollup5m, Sample
from monitoring.services import reports
from monitoring.services.collect import poll_slot
from monitoring.services.rollups import run_rollups

H100_UNITS = 5  # h100-01: 2 GPUs, one of them with 3 MIG instances


@pytest.fixture
def sim(tmp_path):
    sim = start(tmp_path)
    yield sim
    sim.server.stop()


def _read(sim, node: str, age_s: int) -> dict:
    """The node's report for the poll slot `age_s` seconds ago."""
    slot = int(poll_slot(datetime.now(tz=UTC) - timedelta(seconds=age_s)).timestamp())
    return agent.read_metrics(sim.name, node, api_url=kube.api_url_for(sim.cluster), slot=slot)


@pytest.mark.django_db
def test_a_report_after_its_period_but_within_lateness_is_stored_once(sim, settings):
    late = _read(sim, "h100-01", age_s=5 * settings.METRICS_INTERVAL_S)  # five periods late, inside 600 s
    outcome = reports.ingest_reports([late])
    assert (outcome.samples, outcome.refused, outcome.late_dropped_samples) == (H100_UNITS, [], 0)
    assert Sample.objects.filter(ts=datetime.fromtimestamp(late["slot"], tz=UTC)).count() == H100_UNITS

    again = reports.ingest_reports([late])  # redelivered: insert-or-ignore
    assert again.refused == []
    assert Sample.objects.count() == H100_UNITS
    assert Collector.objects.get(target="h100-01").late_dropped_samples == 0


@pytest.mark.django_db
def test_a_report_past_lateness_is_dropped_and_its_samples_counted_on_the_collector(sim, settings):
    settings.MONITORING_ROLLUP_LATENESS_S = 120
    past = _read(sim, "h100-01", age_s=180)
    outcome = reports.ingest_reports([past])
    assert outcome.samples == 0 and outcome.late_dropped_samples == H100_UNITS
    assert outcome.refused == [
        f"{sim.name}/h100-01: slot {past['slot']} is past the lateness window (MONITORING_ROLLUP_LATENESS_S=120)"
    ]
    assert Sample.objects.count() == 0
    collector = Collector.objects.get(target="h100-01")
    # Counted, but not an attempt: the node still counts as missing for this period's re-poll.
    assert (collector.late_dropped_samples, collector.last_attempt_at) == (H100_UNITS, None)

    in_time = _read(sim, "h100-01", age_s=0)
    reports.ingest_reports([past, in_time])  # the count adds up; the report in time is written as usual
    collector.refresh_from_db()
    assert (collector.late_dropped_samples, collector.last_samples) == (2 * H100_UNITS, H100_UNITS)
    assert Sample.objects.count() == H100_UNITS


@pytest.mark.django_db
def test_a_late_report_reaches_the_rollup_of_a_bucket_already_closed(sim, settings):
    late = _read(sim, "h100-01", age_s=settings.MONITORING_ROLLUP_LATENESS_S - 60)
    bucket_end = ceil(datetime.fromtimestamp(late["slot"] + 1, tz=UTC), BUCKET["5m"])
    run_rollups(now=bucket_end + timedelta(seconds=settings.MONITORING_ROLLUP_GRACE_S))  # closes its bucket, empty
    assert not Rollup5m.objects.exists()

    reports.ingest_reports([late])
    run_rollups(now=datetime.now(tz=UTC) + timedelta(seconds=settings.MONITORING_ROLLUP_INTERVAL_S))
    assert sorted(Rollup5m.objects.values_list("bucket", "samples")) == [
        (bucket_end - BUCKET["5m"], 1) for _ in range(H100_UNITS)
    ]


def _request(task, args, *, expires: datetime) -> Request:
    message = TaskMessage(task.name, args=args, expires=expires.isoformat())
    return Request(message, app=app, task=task)


def test_a_read_not_started_within_its_period_is_dropped_and_a_started_one_is_finished(settings):
    args = ("c1", "gpu-node-01", "https://k8s.example", int(poll_slot().timestamp()))
    report = {"body": {"gpus": [{}, {}]}}
    with (
        mock.patch.object(agent, "read_metrics", return_value=report) as read,
        mock.patch.object(transport, "publish") as publish,
    ):
        sent_at = datetime.now(tz=UTC) - timedelta(seconds=settings.METRICS_INTERVAL_S + 1)
        expired = _request(read_node_metrics_task, args, expires=sent_at + timedelta(seconds=30))
        assert expired.execute() is None
        assert (read.call_count, publish.call_count) == (0, 0)

        expires = datetime.now(tz=UTC) + timedelta(seconds=1)

        def slow_read(*_args, **_kwargs):  # the read outlasts its message's expiry
            time.sleep(max(0.0, (expires - datetime.now(tz=UTC)).total_seconds()) + 0.1)
            return report

        read.side_effect = slow_read
        started = _request(read_node_metrics_task, args, expires=expires)
        assert started.execute() == 2
        assert datetime.now(tz=UTC) > expires
        publish.assert_called_once_with(report)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_the_ingest_worker_stores_a_late_report_once_and_counts_one_past_lateness(sim, settings):
    transport.purge()
    late = _read(sim, "h100-01", age_s=5 * settings.METRICS_INTERVAL_S)
    past = _read(sim, "a100-01", age_s=settings.MONITORING_ROLLUP_LATENESS_S + 60)
    for report in (late, past, late):  # the late one delivered twice
        transport.publish(report)
    outcomes = []
    IngestWorker(batch=10, linger_ms=100, on_batch=outcomes.append).run(max_batches=1)
    assert [(o.samples, o.late_dropped_samples) for o in outcomes] == [(2 * H100_UNITS, 3)]  # rows offered
    assert Sample.objects.count() == H100_UNITS  # rows written: the second delivery added none
    assert sorted(Collector.objects.values_list("target", "late_dropped_samples")) == [("a100-01", 3), ("h100-01", 0)]
