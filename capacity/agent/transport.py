"""The control plane's ingest queue: where node agents publish their signed reports.

Plain kombu messages (JSON), not Celery tasks: the ingest worker (`manage.py ingest-worker`)
takes them in batches of up to AGENT_INGEST_BATCH and writes each batch in one transaction, which
a task per message cannot do. Its connection keeps unacknowledged reports under its own keys with
a visibility timeout of AGENT_INGEST_VISIBILITY_S, so a killed ingest worker's batch comes back
within about a minute without touching Celery's own unacked messages (redelivered reports write
nothing twice: samples are insert-or-ignore by (ts, series)).
"""

from __future__ import annotations

from django.conf import settings
from kombu import Connection, Exchange, Queue

from gpuaas.celery import app

INGEST_QUEUE = "ingest"
_exchange = Exchange(INGEST_QUEUE, type="direct", durable=True)
queue = Queue(INGEST_QUEUE, _exchange, routing_key=INGEST_QUEUE, durable=True)


def connection() -> Connection:
    """A broker connection for the ingest queue (separate unacked keys on Redis, see the module doc)."""
    conn = app.connection_for_write()
    if settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        conn.transport_options = {
            **conn.transport_options,
            "visibility_timeout": settings.AGENT_INGEST_VISIBILITY_S,
            "unacked_key": "ingest_unacked",
            "unacked_index_key": "ingest_unacked_index",
            "unacked_mutex_key": "ingest_unacked_mutex",
        }
    return conn


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
