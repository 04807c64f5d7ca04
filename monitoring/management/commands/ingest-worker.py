"""`python manage.py ingest-worker`: write node agents' reports from the ingest queue, in batches.

    manage.py ingest-worker [--batch 500] [--linger-ms 200]

A control-plane process (it needs DATABASE_URL and CELERY_BROKER_URL). Run one or more: each takes
its own batches. SIGTERM finishes the batch in hand. See monitoring/ingest/worker.py.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from monitoring.ingest.worker import IngestWorker


class Command(BaseCommand):
    help = "Consume node agents' signed reports from the ingest queue and write them in batches."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=None, help="Reports per batch (AGENT_INGEST_BATCH).")
        parser.add_argument("--linger-ms", type=int, default=None, help="Wait for a partial batch (ms).")

    def handle(self, *args, batch=None, linger_ms=None, **options):
        if settings.GPUAAS_ROLE == "node-agent":
            raise CommandError("ingest-worker is a control-plane process: unset GPUAAS_ROLE=node-agent")
        if batch is not None and batch < 1:
            raise CommandError("--batch must be at least 1")
        if linger_ms is not None and linger_ms < 0:
            raise CommandError("--linger-ms must be 0 or more")
        self.stdout.write("ingest worker: consuming the ingest queue (Ctrl-C or SIGTERM to stop)")
        IngestWorker(batch=batch, linger_ms=linger_ms).run()
