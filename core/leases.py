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

`Leased`, `LeasedWork` and `LeasedStep` are the claim columns those rows share (abstract: each app's table keeps its own
columns), `LeasedQuerySet` the claim and the sweep's questions, and `give_back_lapsed()` the sweep's
conditional hand-back, so that the reconfiguration engine, drains and rollouts claim and recover alike.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone

logger = logging.getLogger(__name__)


def lease_s() -> int:
    """How long a claim (or an enqueued message) holds its work without a heartbeat."""
    return int(getattr(settings, "WORKFLOW_LEASE_S", 20))


def lease_until(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) + timedelta(seconds=lease_s())


class LeasedQuerySet(models.QuerySet):
    """The claim's questions: who may take a row now, and whose lease ran out."""

    def claimable(self, token: str, now: datetime):
        """Rows free to claim with `token`: unclaimed, already ours (a redelivered message), or whose lease ran out."""
        return self.filter(Q(claim_token="") | Q(claim_token=token) | Q(lease_expires_at__lt=now))

    def claim(self, token: str, now: datetime, **fields) -> int:
        """Take the claimable rows for `token` under a fresh lease (a conditional UPDATE); how many were taken."""
        return self.claimable(token, now).update(claim_token=token[:64], lease_expires_at=lease_until(), **fields)

    def held(self):
        return self.exclude(claim_token="")

    def lease_ran_out(self, now: datetime, *, or_unset: bool = False):
        """Rows whose lease ended before `now` (with `or_unset`, rows with no lease at all too)."""
        lapsed = Q(lease_expires_at__lt=now)
        return self.filter(lapsed | Q(lease_expires_at__isnull=True) if or_unset else lapsed)


class Leased(models.Model):
    """A row one worker at a time claims: the claim's token and the lease that a Heartbeat renews."""

    claim_token = models.CharField(max_length=64, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = LeasedQuerySet.as_manager()

    class Meta:
        abstract = True

    @staticmethod
    def released(**fields) -> dict:
        """UPDATE fields that give the claim back (and end its lease)."""
        return {"claim_token": "", "lease_expires_at": None, **fields}

    def owned(self, token: str, **conditions):
        """This row while `token` holds its claim (what a Heartbeat renews and a worker's writes go through)."""
        return type(self)._default_manager.filter(pk=self.pk, claim_token=token, **conditions)


class LeasedWork(Leased):
    """Claimed work an operator started (a rollout, a reconfiguration, a drain): who and when, how it ended."""

    finished_at = models.DateTimeField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class LeasedStep(LeasedWork):
    """A workflow row run step by step (the reconfiguration engine's Workflow): the claim of the current step,
    its task, its deadline and how many times an operator resumed it."""

    claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    step_deadline = models.DateTimeField(null=True, blank=True, editable=False)
    task_id = models.CharField(max_length=64, blank=True, editable=False)
    attempts = models.PositiveSmallIntegerField(default=0, editable=False, help_text="Resumes so far.")

    class Meta:
        abstract = True

    @staticmethod
    def released(**fields) -> dict:
        """UPDATE fields that give the step's claim back (and end its lease)."""
        return Leased.released(claimed_at=None, **fields)

    @classmethod
    def resumed(cls, **fields) -> dict:
        """UPDATE fields that re-open a failed step for another run (one more attempt, no deadline, no error)."""
        return cls.released(error="", step_deadline=None, attempts=F("attempts") + 1, **fields)


def give_back_lapsed(rows: Iterable[Leased], release: Callable[[], dict], then: Callable, **conditions) -> list:
    """The sweep's hand-back: each of `rows` (whose lease ran out) loses its claim by a conditional UPDATE on the
    token it had (and `conditions`), so two sweeps never both win; `then(row)` runs in the same transaction.
    Returns the rows given back."""
    given = []
    for row in rows:
        with transaction.atomic():
            if row.owned(row.claim_token, **conditions).update(**release()) == 1:
                then(row)
                given.append(row)
    return given


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
