"""The control plane's ingest queue: where node agents publish their signed reports.

Plain kombu messages (JSON), not Celery tasks: the ingest worker (`manage.py ingest-worker`)
takes them in batches of up to AGENT_INGEST_BATCH and writes each batch in one transaction, which
a task per message cannot do. Its connection keeps unacknowledged reports under its own keys with
a visibility timeout of AGENT_INGEST_VISIBILITY_S, so a killed ingest worker's batch comes back
within about a minute without touching Celery's own unacked messages (redelivered reports write
nothing twice: samples are insert-or-ignore by (ts, series)).
"""

from __future__ import annotations

import base64
import json
import logging
import time

from django.conf import settings
from kombu import Connection, Exchange, Queue

from gpuaas.celery import app

logger = logging.getLogger(__name__)

INGEST_QUEUE = "ingest"
_exchange = Exchange(INGEST_QUEUE, type="direct", durable=True)
queue = Queue(INGEST_QUEUE, _exchange, routing_key=INGEST_QUEUE, durable=True)


def is_redis() -> bool:
    return settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://"))


def connection() -> Connection:
    """A broker connection for the ingest queue (separate unacked keys on Redis, see the module doc)."""
    conn = app.connection_for_write()
    if is_redis():
        conn.transport_options = {
            **conn.transport_options,
            "visibility_timeout": settings.AGENT_INGEST_VISIBILITY_S,
            "unacked_key": "ingest_unacked",
            "unacked_index_key": "ingest_unacked_index",
            "unacked_mutex_key": "ingest_unacked_mutex",
        }
    return conn


def backlog() -> int | None:
    """Reports waiting on the ingest queue (not yet taken by an ingest worker); None where the broker cannot say
    cheaply (only Redis is asked: LLEN)."""
    if not is_redis():
        return None
    with app.connection_for_write() as conn:
        return conn.default_channel.client.llen(INGEST_QUEUE)


def publish(report: dict) -> None:
    """Publish one report on the ingest queue (declared on first use; retried on connection errors)."""
    with app.producer_pool.acquire(block=True) as producer:
        producer.publish(
            report,
            exchange=_exchange,
            routing_key=INGEST_QUEUE,
            serializer="json",
            declare=[queue],
            retry=True,
            retry_policy={"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5},
        )


# Pop up to ARGV[1] messages off the queue (kombu pushes on the left, consumers pop on the right) and file
# each under kombu's unacknowledged keys as kombu's Redis QoS does (index: tag -> time taken; hash: tag ->
# the JSON [message, exchange, routing key], the message verbatim), all in one atomic step. Something
# that is not a kombu message (no delivery tag) cannot be filed or ingested: it is dropped and counted.
_TAKE = """
local taken, dropped = {}, 0
for i = 1, tonumber(ARGV[1]) do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then break end
  local ok, message = pcall(cjson.decode, raw)
  local tag = ok and type(message) == 'table' and type(message['properties']) == 'table'
    and message['properties']['delivery_tag']
  if type(tag) == 'string' then
    redis.call('ZADD', KEYS[3], ARGV[2], tag)
    redis.call('HSET', KEYS[2], tag, '[' .. raw .. ',' .. ARGV[3] .. ']')
    taken[#taken + 1] = raw
  else
    dropped = dropped + 1
  end
end
return {dropped, taken}
"""


class RedisBatches:
    """The ingest queue on Redis, a batch per round trip: kombu's own consumer takes one message per BRPOP
    and files and acknowledges each in its own round trips, which cost more CPU than ingesting the report.

    Interoperates with kombu's acknowledgement emulation: a taken message stays in the unacked hash and
    index until ack(); kombu's restore (restore_expired here, or any kombu consumer of these keys) puts
    it back on the queue once it is older than the visibility timeout, flagged as redelivered.
    """

    def __init__(self, conn: Connection, *, restore_every_s: float = 1.0):
        self.channel = conn.default_channel
        self.client = self.channel.client
        self._take = self.client.register_script(_TAKE)
        self._keys = [INGEST_QUEUE, self.channel.unacked_key, self.channel.unacked_index_key]
        self._route = json.dumps([_exchange.name, INGEST_QUEUE])[1:-1]
        self._restore_every_s = restore_every_s
        self._restored_at = 0.0

    def take(self, limit: int) -> list[tuple[object, str]]:
        """Up to `limit` queued reports with their delivery tags (what ack() takes); a message whose body is not
        JSON comes as None (the ingest refuses it as not a report)."""
        dropped, raws = self._take(keys=self._keys, args=[limit, time.time(), self._route])
        if dropped:
            logger.warning("dropped %d message(s) on the ingest queue that are not kombu messages", dropped)
        return [_decode(raw) for raw in raws]

    def ack(self, tags: list[str]) -> None:
        if tags:
            self.client.pipeline().zrem(self._keys[2], *tags).hdel(self._keys[1], *tags).execute()

    def restore_expired(self) -> None:
        """Put back on the queue what was taken longer ago than the visibility timeout and never acknowledged
        (a worker died): kombu's restore, at most once every restore_every_s."""
        if time.monotonic() - self._restored_at >= self._restore_every_s:
            self._restored_at = time.monotonic()
            self.channel.qos.restore_visible(num=self.channel.unacked_restore_limit or 1000, interval=1)


def _decode(raw: bytes) -> tuple[object, str]:
    message = json.loads(raw)
    properties = message.get("properties", {})
    body = message.get("body", "")
    try:
        if properties.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        report = json.loads(body) if message.get("content-type") == "application/json" else None
    except ValueError as exc:
        logger.warning("an ingest message is not JSON: %s", exc)
        report = None
    return report, properties["delivery_tag"]
