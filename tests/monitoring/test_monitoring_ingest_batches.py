"""The ingest queue on Redis taken a batch per round trip, with kombu's acknowledgement emulation kept.

Agents publish through kombu (capacity.agent.transport.publish); the ingest worker takes up to a batch
in one script call, files each message under kombu's unacknowledged keys, and acknowledges the batch
in one pipeline after its commit. What a dead worker took and never acknowledged comes back after
the visibility timeout, through kombu's own restore.
"""

import time
from unittest import mock

import pytest

from capacity.agent import transport

pytestmark = [pytest.mark.redis]


@pytest.fixture
def queue(settings):
    settings.AGENT_INGEST_VISIBILITY_S = 1
    with transport.connection() as conn:
        client = conn.default_channel.client
        client.delete(transport.INGEST_QUEUE, "ingest_unacked", "ingest_unacked_index")
        yield transport.RedisBatches(conn, restore_every_s=0), client
        client.delete(transport.INGEST_QUEUE, "ingest_unacked", "ingest_unacked_index")


def test_a_batch_is_taken_in_order_kept_unacknowledged_and_acknowledged_at_once(queue):
    batches, client = queue
    for n in range(3):
        transport.publish({"n": n, "value": 0.1 + n})
    first = batches.take(2)
    assert [report for report, _ in first] == [{"n": 0, "value": 0.1}, {"n": 1, "value": 1.1}]
    assert (
        client.llen(transport.INGEST_QUEUE),
        client.hlen("ingest_unacked"),
        client.zcard("ingest_unacked_index"),
    ) == (
        1,
        2,
        2,
    )
    rest = batches.take(10)
    assert [report for report, _ in rest] == [{"n": 2, "value": 2.1}]
    assert batches.take(10) == []
    batches.ack([tag for _, tag in first + rest])
    assert (client.hlen("ingest_unacked"), client.zcard("ingest_unacked_index")) == (0, 0)


def test_a_batch_never_acknowledged_comes_back_after_the_visibility_timeout(queue):
    batches, client = queue
    transport.publish({"n": 1})
    transport.publish({"n": 2})
    taken = batches.take(10)  # ... and the worker dies before it acknowledges
    batches.restore_expired()
    assert client.llen(transport.INGEST_QUEUE) == 0  # still within the visibility timeout
    time.sleep(1.2)
    batches.restore_expired()
    again = batches.take(10)
    assert sorted(r["n"] for r, _ in again) == [1, 2]
    assert sorted(tag for _, tag in again) == sorted(tag for _, tag in taken)
    batches.ack([tag for _, tag in again])
    assert (client.llen(transport.INGEST_QUEUE), client.hlen("ingest_unacked")) == (0, 0)


def test_a_message_that_is_not_json_is_handed_over_as_no_report(queue):
    batches, _ = queue
    with transport.connection() as conn:
        conn.Producer().publish(
            b"\x00junk",
            exchange="",
            routing_key=transport.INGEST_QUEUE,
            serializer=None,
            content_type="application/octet-stream",
            declare=[transport.queue],
        )
    [(report, tag)] = batches.take(10)
    assert report is None and tag
    batches.ack([tag])


def test_something_that_is_not_a_kombu_message_is_dropped_and_the_rest_taken(queue):
    batches, client = queue
    transport.publish({"n": 1})
    client.lpush(transport.INGEST_QUEUE, b"not json", b'{"properties": {}}')  # pushed by something else
    transport.publish({"n": 2})
    # The logger itself, not caplog: a Celery worker started in-process by an earlier test rewires logging.
    with mock.patch.object(transport.logger, "warning") as warning:
        taken = batches.take(10)
    assert [report for report, _ in taken] == [{"n": 1}, {"n": 2}]
    warning.assert_called_once()
    assert warning.call_args.args[1] == 2
    assert (client.llen(transport.INGEST_QUEUE), client.hlen("ingest_unacked")) == (0, 2)
    batches.ack([tag for _, tag in taken])
