"""Recovery of billing work after a worker's death: leases on metering and month closes, and the sweep.

Metering holds a lease on the MeteringWatermark row while it runs, a month close on its BillingRun
row (core.leases: renewed by a heartbeat thread). The sweep (beat, every WORKFLOW_SWEEP_S)
re-enqueues metering when a complete hour is waiting and no live run holds the lease, and each
running close whose lease ran out. Re-running is safe: hours are claimed through the watermark in
the transaction that inserts their rows (a killed run's hour rolls back whole), usage rows are
unique per (allocation, hour), and statements are regenerated in place.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from core.leases import lease_s, lease_until

from .choices import RunKind, RunStatus
from .models import BillingRun, MeteringWatermark
from .periods import HOUR, floor_hour
from .services import watermark

logger = logging.getLogger(__name__)


def run_token(task_id: str | None) -> str:
    return (task_id or f"local-{uuid.uuid4()}")[:64]


def _free(now: datetime) -> Q:
    return Q(claimed_by="") | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)


def claim_metering(token: str) -> bool:
    """Take the metering lease for `token`; False while another live metering run holds it."""
    now = timezone.now()
    return (
        MeteringWatermark.objects.filter(_free(now) | Q(claimed_by=token), pk=1).update(
            claimed_by=token, lease_expires_at=lease_until(now)
        )
        == 1
    )


def release_metering(token: str) -> None:
    MeteringWatermark.objects.filter(pk=1, claimed_by=token).update(claimed_by="", lease_expires_at=None)


def claim_close(run_id: int, token: str) -> bool:
    """Take a running month close for `token`: unclaimed, ours already, or its holder's lease ran out."""
    now = timezone.now()
    return (
        BillingRun.objects.filter(
            _free(now) | Q(claimed_by=token), pk=run_id, kind=RunKind.CLOSE, status=RunStatus.RUNNING
        ).update(claimed_by=token, lease_expires_at=lease_until(now))
        == 1
    )


def sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Re-enqueue billing work that no live worker holds (beat, every WORKFLOW_SWEEP_S).

    Metering: when a complete hour waits (the watermark is behind) and the lease is free. Closes:
    running close runs whose lease ran out (or that no worker claimed within one lease of being
    started). Each re-send first moves the lease on with a conditional UPDATE on the value it read,
    so concurrent sweeps send one message. Returns what was sent.
    """
    from .tasks import close_month_task, meter_usage_task  # cycle: billing.tasks imports this module

    now = now or timezone.now()
    sent = {"metering": 0, "closes": 0}
    watermark()  # a fresh installation has no row until metering first runs
    mark = MeteringWatermark.objects.filter(pk=1).values("metered_until", "claimed_by", "lease_expires_at").first()
    lease_free = mark is not None and (mark["lease_expires_at"] is None or mark["lease_expires_at"] < now)
    if lease_free and mark["metered_until"] + HOUR <= floor_hour(now):
        if MeteringWatermark.objects.filter(pk=1, lease_expires_at=mark["lease_expires_at"]).update(
            claimed_by="", lease_expires_at=lease_until(now)
        ):
            if mark["claimed_by"]:
                logger.warning("metering run %s lost (lease expired); metering re-queued", mark["claimed_by"])
            meter_usage_task.apply_async(expires=lease_s())
            sent["metering"] = 1
    unclaimed_before = now - timedelta(seconds=lease_s())
    lapsed = BillingRun.objects.filter(kind=RunKind.CLOSE, status=RunStatus.RUNNING).filter(
        Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True, started_at__lt=unclaimed_before)
    )
    for pk, lease, holder in lapsed.order_by("pk").values_list("pk", "lease_expires_at", "claimed_by"):
        if BillingRun.objects.filter(pk=pk, status=RunStatus.RUNNING, lease_expires_at=lease).update(
            claimed_by="", lease_expires_at=lease_until(now)
        ):
            logger.warning(
                "month close run %s (%s) re-queued", pk, f"worker {holder} lost" if holder else "not picked up"
            )
            close_month_task.apply_async(kwargs={"run_id": pk}, expires=24 * 3600)
            sent["closes"] += 1
    return sent
