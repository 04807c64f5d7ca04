"""The control plane's ingest queue: where node agents publish their signed reports.

Not Celery tasks: the ingest worker (`manage.py ingest-worker`) takes reports in batches of up to
AGENT_INGEST_BATCH and writes each batch in one transaction, which a task per message cannot do.

On Redis (a redis:// or rediss:// CELERY_BROKER_URL) the queue is a Redis stream, STREAM_KEY, read through
one consumer group, GROUP, with redis-py (https://redis.io/docs/latest/develop/data-types/streams/):
agents XADD a report; each ingest worker process is one consumer (hostname-pid) that XREADGROUPs up
to a batch, XACKs and XDELs it after the batch's transaction commits, and XAUTOCLAIMs what another
consumer took and left unacknowledged for longer than AGENT_INGEST_VISIBILITY_S (a killed worker's batch).
Redelivered reports write nothing twice: samples are insert-or-ignore by (ts, series). A report claimed more
than MAX_DELIVERIES times (it kills every worker that takes it) is acknowledged unwritten, logged and counted.
The stream is not capped (XADD without MAXLEN, which would trim unread reports silently, like the Redis list
before it): acknowledged entries are deleted, so its length is what is unread or in hand, and
`monitoring.tasks` warns when ingest falls behind (backlog()).

Elsewhere (the embedded demo's SQLite broker) the queue is a plain kombu queue of JSON messages, INGEST_QUEUE,
read by a kombu consumer with prefetch = the batch.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time

import redis
from django.conf import settings
from kombu import Connection, Exchange, Queue
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from core.celery import app

logger = logging.getLogger(__name__)

INGEST_QUEUE = "ingest"  # the kombu queue (embedded broker)
STREAM_KEY = "ingest:stream"  # the Redis stream (not "ingest": a list of that name may remain from before)
GROUP = "ingest"
FIELD = b"report"
MAX_DELIVERIES = 5  # a report delivered more often than this (each time its worker died) is dropped, counted

_exchange = Exchange(INGEST_QUEUE, type="direct", durable=True)
queue = Queue(INGEST_QUEUE, _exchange, routing_key=INGEST_QUEUE, durable=True)


def is_redis() -> bool:
    return settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://"))


@functools.cache
def _client(url: str) -> redis.Redis:
    # One pool per process (redis-py's pool notices a fork and reconnects); connection errors are retried.
    return redis.Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.2), retries=5),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        health_check_interval=30,
    )


def client() -> redis.Redis:
    return _client(settings.CELERY_BROKER_URL)


def connection() -> Connection:
    """A broker connection for the ingest queue on a broker other than Redis (the embedded one)."""
    return app.connection_for_write()


def backlog() -> int | None:
    """Reports waiting on the ingest queue, not yet taken by an ingest worker; None where the broker cannot say
    cheaply (only Redis is asked: the group's lag from XINFO GROUPS, https://redis.io/commands/xinfo-groups,
    else the stream's length less the group's pending entries)."""
    if not is_redis():
        return None
    try:
        length, groups = client().pipeline(transaction=False).xlen(STREAM_KEY).xinfo_groups(STREAM_KEY).execute()
    except redis.ResponseError:  # no stream yet
        return 0
    for group in groups:
        if group["name"] == GROUP.encode():
            return group["lag"] if group.get("lag") is not None else max(0, length - group["pending"])
    return length  # no ingest worker has ever started: everything waits


def in_flight() -> int:
    """Redis: reports not yet acknowledged, waiting or in a worker's hands (acknowledged ones are deleted)."""
    return client().xlen(STREAM_KEY)


def publish(report: dict) -> None:
    """Publish one report on the ingest queue (retried on connection errors)."""
    if is_redis():
        client().xadd(STREAM_KEY, {FIELD: json.dumps(report, separators=(",", ":"))})
        return
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


def purge() -> None:
    """Drop every queued report (tests, benchmarks): the stream and its group on Redis, the kombu queue elsewhere."""
    if is_redis():
        client().delete(STREAM_KEY)
        return
    with connection() as conn:
        conn.default_channel.queue_purge(INGEST_QUEUE)


def consumer_name() -> str:
    """Unique per process: a restarted worker is a new consumer, and its predecessor's batch is claimed."""
    return f"{socket.gethostname()}-{os.getpid()}"


class RedisBatches:
    """The ingest queue on Redis, a batch per round trip, through the consumer group.

    take() returns (report, entry id) pairs: first what dead consumers left pending for longer than the
    visibility timeout (XAUTOCLAIM, looked at once every claim_every_s), then new entries (XREADGROUP).
    ack() acknowledges and deletes a batch's entries in one MULTI. `dropped` counts reports given up on.
    """

    def __init__(
        self,
        *,
        consumer: str | None = None,
        visibility_s: float | None = None,
        claim_every_s: float = 1.0,
    ):
        self.client = client()
        self.consumer = consumer or consumer_name()
        visibility = settings.AGENT_INGEST_VISIBILITY_S if visibility_s is None else visibility_s
        self.visibility_ms = int(visibility * 1000)
        self.claim_every_s = claim_every_s
        self._claimed_at = float("-inf")
        self._pruned_at = time.monotonic()
        self.dropped = 0
        self._ensure_group()

    def _ensure_group(self) -> None:
        # From the stream's first entry (0): reports published before any worker started are read too.
        try:
            self.client.xgroup_create(STREAM_KEY, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def take(self, limit: int, *, block_ms: int | None = None) -> list[tuple[object, bytes]]:
        """Up to `limit` reports; waits up to block_ms for the first when none is there (None: not at all). A body
        that is not a JSON report comes as None (the ingest refuses it as not a report, and it is acknowledged)."""
        entries = self._claim(limit) if time.monotonic() - self._claimed_at >= self.claim_every_s else []
        if len(entries) < limit:
            entries += self._read(limit - len(entries), None if entries else block_ms)
        return [(_decode(fields), entry_id) for entry_id, fields in entries]

    def _read(self, count: int, block_ms: int | None) -> list:
        for attempt in (1, 2):
            try:
                reply = self.client.xreadgroup(GROUP, self.consumer, {STREAM_KEY: ">"}, count=count, block=block_ms)
                return reply[0][1] if reply else []
            except redis.ResponseError as exc:  # the stream (and its group) was deleted: purge()
                if "NOGROUP" not in str(exc) or attempt == 2:
                    raise
                self._ensure_group()
        return []

    def _claim(self, limit: int) -> list:
        """Entries pending longer than the visibility timeout (their consumer died), now this consumer's; those
        delivered more than MAX_DELIVERIES times are dropped and counted (a poison report)."""
        self._claimed_at = time.monotonic()
        try:
            _cursor, claimed, *_deleted = self.client.xautoclaim(
                STREAM_KEY, GROUP, self.consumer, self.visibility_ms, "0-0", count=limit
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._ensure_group()
            return []
        claimed = [(entry_id, fields) for entry_id, fields in claimed if fields is not None]
        if not claimed:
            self._prune_consumers()
            return []
        pending = self.client.xpending_range(
            STREAM_KEY, GROUP, claimed[0][0], claimed[-1][0], len(claimed), consumername=self.consumer
        )
        poison = {p["message_id"] for p in pending if p["times_delivered"] > MAX_DELIVERIES}
        if poison:
            self.ack(sorted(poison))
            self.dropped += len(poison)
            logger.error(
                "dropped %d report(s) delivered more than %d times (each time their ingest worker died): %s",
                len(poison),
                MAX_DELIVERIES,
                sorted(poison),
            )
        logger.warning("claimed %d report(s) a dead ingest worker left unacknowledged", len(claimed) - len(poison))
        return [(entry_id, fields) for entry_id, fields in claimed if entry_id not in poison]

    def _prune_consumers(self) -> None:
        """Forget consumers (dead workers) that hold nothing and were idle for ten visibility timeouts; at most
        once per visibility timeout."""
        if time.monotonic() - self._pruned_at < self.visibility_ms / 1000:
            return
        self._pruned_at = time.monotonic()
        for c in self.client.xinfo_consumers(STREAM_KEY, GROUP):
            if c["pending"] == 0 and c["idle"] > 10 * self.visibility_ms and c["name"] != self.consumer.encode():
                self.client.xgroup_delconsumer(STREAM_KEY, GROUP, c["name"])

    def ack(self, ids: list[bytes]) -> None:
        """Acknowledge and delete (the stream keeps only what is unread or in hand), in one MULTI."""
        if ids:
            self.client.pipeline(transaction=True).xack(STREAM_KEY, GROUP, *ids).xdel(STREAM_KEY, *ids).execute()


def _decode(fields: dict) -> object:
    try:
        return json.loads(fields[FIELD])
    except (KeyError, ValueError) as exc:
        logger.warning("an ingest entry is not a JSON report: %r", exc)
        return None
