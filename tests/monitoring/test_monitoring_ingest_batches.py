"""The ingest queue on Redis: a stream read through one consumer group, a batch per round trip.

Agents XADD (capacity.agent.transport.publish); an ingest worker XREADGROUPs up to a batch, and XACKs and
XDELs it after its commit. What a dead worker took and never acknowledged is claimed by another (XAUTOCLAIM)
once idle past the visibility timeout; a report that kills every worker that takes it is given up after
MAX_DELIVERIES and counted.
"""

import time
from unittest import mock

import pytest
from monitoring_sim import start

from capacity.adapters import kubernetes as kube
from capacity.agent import node as agent
from capacity.agent import transport
from monitoring.ingest.worker import IngestWorker
from monitoring.models import Sample
from monitoring.services.collect import poll_slot

pytestmark = [pytest.mark.redis]

VISIBILITY_S = 0.2


@pytest.fixture
def stream():
    transport.purge()
    yield transport.client()
    transport.purge()


def batches(consumer: str) -> transport.RedisBatches:
    return transport.RedisBatches(consumer=consumer, visibility_s=VISIBILITY_S, claim_every_s=0)


def test_a_batch_is_read_in_order_kept_pending_and_acknowledged_and_deleted_at_once(stream):
    worker = batches("a")
    for n in range(3):
        transport.publish({"n": n, "value": 0.1 + n})
    assert transport.backlog() == 3
    first = worker.take(2)
    assert [report for report, _ in first] == [{"n": 0, "value": 0.1}, {"n": 1, "value": 1.1}]
    assert (transport.backlog(), stream.xpending(transport.STREAM_KEY, transport.GROUP)["pending"]) == (1, 2)
    rest = worker.take(10)
    assert [report for report, _ in rest] == [{"n": 2, "value": 2.1}]
    assert worker.take(10) == []
    assert worker.take(10, block_ms=10) == []  # waits in Redis, then comes back empty
    worker.ack([entry for _, entry in first + rest])
    assert stream.xpending(transport.STREAM_KEY, transport.GROUP)["pending"] == 0
    assert (stream.xlen(transport.STREAM_KEY), transport.backlog()) == (0, 0)  # acknowledged entries are deleted


def test_reports_published_before_any_worker_started_are_read(stream):
    transport.publish({"n": 1})
    assert transport.backlog() == 1  # no group yet: everything waits
    assert [report for report, _ in batches("a").take(10)] == [{"n": 1}]


def test_a_killed_workers_batch_is_claimed_by_another_after_the_visibility_timeout(stream):
    dead, alive = batches("dead"), batches("alive")
    transport.publish({"n": 1})
    transport.publish({"n": 2})
    taken = dead.take(10)  # ... and the worker dies before it acknowledges
    assert alive.take(10) == []  # still within the visibility timeout: not another's
    time.sleep(VISIBILITY_S + 0.1)
    again = alive.take(10)
    assert [r["n"] for r, _ in again] == [1, 2]
    assert [entry for _, entry in again] == [entry for _, entry in taken]
    alive.ack([entry for _, entry in again])
    assert stream.xlen(transport.STREAM_KEY) == 0
    dead.ack([entry for _, entry in taken])  # a late acknowledgement of the same entries changes nothing
    assert stream.xlen(transport.STREAM_KEY) == 0


def test_a_report_that_kills_every_worker_is_dropped_and_counted_not_claimed_forever(stream):
    transport.publish({"poison": True})
    transport.publish({"n": 2})
    batches("w0").take(1)  # the poison: its worker dies
    for n in range(1, transport.MAX_DELIVERIES):
        time.sleep(VISIBILITY_S + 0.05)
        [(report, _)] = batches(f"w{n}").take(1)  # claimed again, and that worker dies too
        assert report == {"poison": True}
    time.sleep(VISIBILITY_S + 0.05)
    last = batches("last")
    with mock.patch.object(transport.logger, "error") as error:
        taken = last.take(10)
    assert [report for report, _ in taken] == [{"n": 2}]
    assert last.dropped == 1
    error.assert_called_once()
    last.ack([entry for _, entry in taken])
    assert stream.xlen(transport.STREAM_KEY) == 0


def test_an_entry_that_is_not_a_json_report_is_handed_over_as_no_report(stream):
    transport.publish({"n": 1})
    stream.xadd(transport.STREAM_KEY, {transport.FIELD: b"\x00junk"})
    stream.xadd(transport.STREAM_KEY, {b"other": b"{}"})  # written by something else
    with mock.patch.object(transport.logger, "warning") as warning:
        taken = batches("a").take(10)
    assert [report for report, _ in taken] == [{"n": 1}, None, None]
    assert warning.call_count == 2


def test_a_purged_stream_is_recreated_with_its_group(stream):
    worker = batches("a")
    transport.purge()
    transport.publish({"n": 1})
    assert [report for report, _ in worker.take(10)] == [{"n": 1}]


def _slot() -> int:
    return int(poll_slot().timestamp())


@pytest.fixture
def sim(tmp_path):
    sim = start(tmp_path)
    yield sim
    sim.server.stop()


@pytest.mark.django_db(transaction=True)
def test_the_worker_acknowledges_after_its_commit_and_a_claimed_redelivery_writes_nothing_twice(stream, sim, settings):
    """Killed after its commit, before its acknowledgement: another worker claims the batch after the
    visibility timeout, writes it again as nothing new (insert-or-ignore), and acknowledges it."""
    settings.AGENT_INGEST_VISIBILITY_S = VISIBILITY_S
    transport.publish(agent.read_metrics(sim.name, "h100-01", api_url=kube.api_url_for(sim.cluster), slot=_slot()))
    with mock.patch("monitoring.ingest.worker.crash_point", side_effect=RuntimeError("SIGKILL")):
        with pytest.raises(RuntimeError):
            IngestWorker(batch=10, linger_ms=0).run(max_batches=1)
    rows = Sample.objects.count()
    assert rows and stream.xpending(transport.STREAM_KEY, transport.GROUP)["pending"] == 1  # written, not acked
    time.sleep(VISIBILITY_S + 0.1)
    outcomes = []
    with mock.patch.object(transport, "consumer_name", return_value="replacement"):
        IngestWorker(batch=10, linger_ms=0, on_batch=outcomes.append).run(max_batches=1)
    assert [o.refused for o in outcomes] == [[]]
    assert Sample.objects.count() == rows
    assert stream.xlen(transport.STREAM_KEY) == 0
