"""The queue's order: operator moves, then priority class, then fair share, then age (pools/queue.py).

Fair share orders a request for its first QUEUE_AGED_AFTER_H hours of waiting only: from then on it is
"aged", ahead of every younger request of its class and served by age among the aged. A project with a
high share still waits behind lower shares, but only for so long: no stream of later arrivals can starve
it, and its start no longer depends on who else arrives (which the forecast could only guess).

Apart from pools/queue.py so the forecast (pools/forecast.py), which the queue calls, can read it too.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.db.models import DurationField, ExpressionWrapper, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from capacity.mig.share import unit_share

from .choices import PriorityClass
from .models import Allocation, PoolRequest
from .queue_models import ProjectQueueWeight, QueueEntry

PRIORITY_RANK = {PriorityClass.PRODUCTION: 0, PriorityClass.STAGING: 1, PriorityClass.DEVELOPMENT: 2}


def spec_key(request: PoolRequest) -> tuple:
    """Requests with the same key compete for the same units."""
    return (request.spec_kind, request.product, request.profile_name, request.tier, request.cluster_id)


# --- Fair share and order ------------------------------------------------------------------------


def recent_gpu_hours(project_ids, *, now: dt.datetime | None = None) -> dict[int, float]:
    """GPU-hours each project reserved over the fair-share window (units weighted by capacity.mig.share).

    Held time is summed in SQL per (project, kind of unit); the share of each kind is applied here.
    """
    now = now or timezone.now()
    since = now - dt.timedelta(hours=settings.QUEUE_FAIR_SHARE_WINDOW_H)
    held = ExpressionWrapper(
        Least(Coalesce("released_at", Value(now)), Value(now)) - Greatest("allocated_at", Value(since)),
        output_field=DurationField(),
    )
    rows = (
        Allocation.objects.filter(project_id__in=project_ids, allocated_at__lt=now)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=since))
        .values("project_id", "kind", "product", "profile_name", "compute_slices", "gpu__node__timeslice_replicas")
        .annotate(held=Sum(held))
        .order_by()
    )
    hours: dict[int, float] = dict.fromkeys(project_ids, 0.0)
    for row in rows:
        share = unit_share(
            row["kind"],
            row["product"],
            row["profile_name"],
            compute_slices=row["compute_slices"],
            replicas=row["gpu__node__timeslice_replicas"] or 1,
        )
        hours[row["project_id"]] += max(0.0, row["held"].total_seconds() / 3600) * float(share)
    return hours


def fair_shares(project_ids, *, now: dt.datetime | None = None) -> dict[int, float]:
    """Recent GPU-hours over the project's weight: the lower, the sooner it is served."""
    hours = recent_gpu_hours(project_ids, now=now)
    weights = dict(ProjectQueueWeight.objects.filter(project_id__in=project_ids).values_list("project_id", "weight"))
    return {pk: hours[pk] / float(weights.get(pk, 1)) for pk in hours}


def aged_at(queued_at: dt.datetime) -> dt.datetime | None:
    """When a request queued at `queued_at` stops being ordered by fair share (None: never)."""
    limit = settings.QUEUE_AGED_AFTER_H
    return queued_at + dt.timedelta(hours=limit) if limit else None


def is_aged(queued_at: dt.datetime, now: dt.datetime) -> bool:
    at = aged_at(queued_at)
    return at is not None and at <= now


@dataclass
class Place:
    entry: QueueEntry
    position: int  # 1-based
    fair_share: float
    aged: bool  # served by age now, no longer by fair share


def ordered(*, now: dt.datetime | None = None, entries=None) -> list[Place]:
    """The waiting entries in queue order, with their position and the fair share that placed them."""
    if entries is None:
        entries = QueueEntry.objects.waiting().select_related("request__project", "operator_approved_by")
    entries = list(entries)
    now = now or timezone.now()
    shares = fair_shares({e.request.project_id for e in entries}, now=now)
    aged = {e.pk for e in entries if is_aged(e.queued_at, now)}

    def key(entry: QueueEntry):
        request = entry.request
        return (
            entry.manual_rank is None,
            entry.manual_rank or 0,
            PRIORITY_RANK[request.effective_priority],
            entry.pk not in aged,
            None if entry.pk in aged else shares[request.project_id],  # aged: by age alone
            entry.queued_at,
            entry.pk,
        )

    entries.sort(key=key)
    return [Place(e, i, shares[e.request.project_id], e.pk in aged) for i, e in enumerate(entries, start=1)]


def position_of(request: PoolRequest) -> int | None:
    for place in ordered():
        if place.entry.request_id == request.pk:
            return place.position
    return None
