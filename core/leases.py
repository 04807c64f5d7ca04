"""Leases on long operations, so that a sweep can tell a dead worker's work from live work.

A workflow row (GpuPool provisioning, MigReconfiguration step, BillingRun month close, the metering
watermark) carries `lease_expires_at`. Enqueuing sets it to now + WORKFLOW_LEASE_S (the message must
be picked up by then), claiming sets it again together with the claim token, and while the worker
runs, a Heartbeat thread pushes it forward every third of the lease. A worker that is SIGKILLed
stops heart-beating, its lease runs out, and the beat sweep (every WORKFLOW_SWEEP_S) hands the work
to a live worker: recovery within lease + sweep period, never waiting on the broker's redelivery
(the Redis visibility timeout is an hour).

`crash_point()` is the test-only hook of the fault suite (tests/faults/): a worker started with
GPUAAS_CRASH_AT naming a point SIGKILLs itself when it gets there. Production never sets it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

logger = logging.getLogger(__name__)


def lease_s() -> int:
    """How long a claim (or an enqueued message) holds its work without a heartbeat."""
    return int(getattr(settings, "WORKFLOW_LEASE_S", 20))


def lease_until(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) + timedelta(seconds=lease_s())


class Heartbeat:
    """Context manager: while the body runs, renew `queryset`'s `lease_expires_at` every third of the lease.

    `queryset` selects the claimed row by its claim (pk and token), so a heartbeat never renews a lease
    that another worker has taken over. The thread has its own database connection, closed on exit.
    Short bodies never touch the database from the thread (the first beat comes after a third of the lease).
    """

    def __init__(self, queryset, *, field: str = "lease_expires_at"):
        self.queryset = queryset
        self.field = field
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        interval = max(lease_s() / 3, 0.2)
        try:
            while not self._stop.wait(interval):
                try:
                    self.queryset.update(**{self.field: lease_until()})
                except Exception:  # a missed beat only shortens the lease; never kill the work for it
                    logger.warning("lease heartbeat failed", exc_info=True)
                    close_old_connections()
        finally:
            connection.close()

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def crash_point(name: str) -> None:
    """Test-only: SIGKILL this process at `name` when GPUAAS_CRASH_AT (comma-separated) names it.

    With GPUAAS_CRASH_MARKER_DIR set, each point fires once: a marker file is created atomically
    before the kill, so the next worker gets past it. Does nothing when GPUAAS_CRASH_AT is unset.
    """
    points = os.environ.get("GPUAAS_CRASH_AT")
    if not points or name not in points.split(","):
        return
    marker_dir = os.environ.get("GPUAAS_CRASH_MARKER_DIR")
    if marker_dir:
        try:
            os.close(os.open(os.path.join(marker_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    logger.warning("crash point %s: SIGKILL pid %s", name, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
