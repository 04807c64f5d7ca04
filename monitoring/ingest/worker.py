"""The ingest worker: node agents' reports from the broker, written in batches (`manage.py ingest-worker`).

Not a Celery task per message: it takes up to AGENT_INGEST_BATCH reports, waits at most
AGENT_INGEST_LINGER_MS for a partial batch to fill, writes the batch with `ingest_reports` (one COPY
per poll slot), and acknowledges the messages only after that commit. A worker killed before it
acknowledges leaves its batch unacknowledged; the broker delivers it again after
AGENT_INGEST_VISIBILITY_S (Redis) and the second write changes nothing.

On Redis the queue is a stream read through one consumer group (`transport.RedisBatches`): a batch is one
XREADGROUP (blocking while idle) and its acknowledgement one XACK + XDEL; each worker process is its own
consumer, and what a dead one left unacknowledged is claimed (XAUTOCLAIM) after the visibility timeout.
Other brokers (the embedded demo's) go through a plain kombu consumer (prefetch = the batch).
A batch that raises is retried report by report, so one bad report cannot hold back the others;
a report that still raises is logged and dropped (it would fail again on every delivery).
Several ingest workers may consume the queue at once; each batch is its own transactions.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections

from capacity.agent import protocol, transport
from capacity.services.inventory import ingest_inventory_reports
from core.leases import crash_point

from ..services.reports import IngestOutcome, ingest_reports

logger = logging.getLogger(__name__)

_IDLE_BLOCK_MS = 1000  # how long an idle Redis worker waits in XREADGROUP before it looks at stop()


class IngestWorker:
    def __init__(self, *, batch: int | None = None, linger_ms: int | None = None, on_batch: Callable | None = None):
        self.batch = batch or settings.AGENT_INGEST_BATCH
        self.linger_s = (settings.AGENT_INGEST_LINGER_MS if linger_ms is None else linger_ms) / 1000
        self.on_batch = on_batch
        self.pending: list = []  # (report, what acknowledges it)
        self.stopping = False
        self.batches = 0
        self.reports = 0
        self._ack: Callable[[list], None] = _ack_each

    def stop(self, *_args) -> None:
        """Finish the batch in hand, then leave (SIGTERM, SIGINT)."""
        self.stopping = True

    def _received(self, body, message) -> None:
        self.pending.append((body, message))

    def run(self, *, max_batches: int | None = None) -> None:
        """Consume until stop() (SIGTERM or SIGINT when run in the main thread) or max_batches."""
        if threading.current_thread() is threading.main_thread():  # else the thread's owner calls stop()
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        if transport.is_redis():
            source = transport.RedisBatches()
            self._ack = source.ack
            while not self.stopping and (max_batches is None or self.batches < max_batches):
                self._take(source)
                if self.pending:
                    self.flush()
            return
        with transport.connection() as conn:
            with conn.Consumer(transport.queue, callbacks=[self._received], accept=["json"]) as consumer:
                consumer.qos(prefetch_count=self.batch)
                while not self.stopping and (max_batches is None or self.batches < max_batches):
                    self._fill(conn)
                    if self.pending:
                        self.flush()

    def _take(self, source: transport.RedisBatches) -> None:
        """Redis: take what is queued, up to the batch, until it is full or the linger after the first report
        has passed. While idle, wait in Redis (XREADGROUP BLOCK) up to _IDLE_BLOCK_MS, then go back to run()
        (it checks max_batches and stopping)."""
        first_at = None
        while len(self.pending) < self.batch and not self.stopping:
            if first_at is None:
                block_ms = _IDLE_BLOCK_MS
            else:
                left_s = self.linger_s - (time.monotonic() - first_at)
                if left_s <= 0:
                    return
                block_ms = max(1, int(left_s * 1000))  # never 0: BLOCK 0 waits forever
            taken = source.take(self.batch - len(self.pending), block_ms=block_ms)
            if not taken:
                return
            self.pending += taken
            if first_at is None:
                first_at = time.monotonic()

    def _fill(self, conn) -> None:
        """Drain messages until the batch is full, or the linger after the first one has passed."""
        first_at = None
        while len(self.pending) < self.batch and not self.stopping:
            if first_at is not None and time.monotonic() - first_at >= self.linger_s:
                return
            try:
                conn.drain_events(timeout=self.linger_s if first_at is not None else 1.0)
            except TimeoutError:  # nothing more for now: write what there is
                return
            if self.pending and first_at is None:
                first_at = time.monotonic()

    def flush(self) -> IngestOutcome:
        batch, self.pending = self.pending, []
        close_old_connections()
        try:
            outcome = _ingest([body for body, _ in batch])
        except Exception:
            logger.exception("ingest of a batch of %d reports failed; retrying them one by one", len(batch))
            outcome = IngestOutcome()
            for body, _ in batch:
                try:
                    one = _ingest([body])
                except Exception:
                    logger.exception("a report failed to ingest and is dropped: %.200r", body)
                    continue
                outcome.results.update(one.results)
                outcome.samples += one.samples
                outcome.refused += one.refused
                outcome.late_dropped_samples += one.late_dropped_samples
        crash_point("ingest.committed")  # fault tests: written but not acknowledged
        self._ack([message for _, message in batch])
        self.batches += 1
        self.reports += len(batch)
        if self.on_batch is not None:
            self.on_batch(outcome)
        logger.info("ingested %s", outcome.summary())
        return outcome


def _ack_each(messages: list) -> None:
    for message in messages:
        message.ack()


def _ingest(reports: list) -> IngestOutcome:
    """Inventory reports to capacity's reconcile, everything else to the metrics ingest (which refuses junk)."""
    inventory = [r for r in reports if isinstance(r, dict) and r.get("kind") == protocol.KIND_INVENTORY]
    if inventory:
        ingest_inventory_reports(inventory)
    return ingest_reports(
        [r for r in reports if not (isinstance(r, dict) and r.get("kind") == protocol.KIND_INVENTORY)]
    )
