"""The queue's rules, in one object both the live queue pass (scheduling/queue.py) and the forecast
(scheduling/forecast/) read, so a rule changed here changes both.

Order: operator moves first (by the rank the move gave them), then priority class, then fair share, then age.
Fair share orders a request for its first QUEUE_AGED_AFTER_H hours of waiting only: from then on it is "aged",
ahead of every younger request of its class and served by age among the aged. A project with a high share
still waits behind lower shares, but only for so long: no stream of later arrivals can starve it, and its
start no longer depends on who else arrives (which the forecast could only guess).

Competition: requests with the same spec_key() compete for the same units; a head that does not fit blocks
the requests behind it of its spec (never the others). Fit: a request fits when the units approval could take
for it now (pools.units.usable_free) cover its count.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import DurationField, ExpressionWrapper, F, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from capacity.mig.share import held_share
from capacity.models import SHARE_FIELDS
from policies import policy
from pools import units
from pools.choices import PriorityClass
from pools.models import Allocation, PoolRequest
from pools.models.queue import ProjectQueueWeight, QueueEntry

from .policies import PolicyBook


@dataclass
class Place:
    entry: QueueEntry
    position: int  # 1-based
    fair_share: float
    aged: bool  # served by age now, no longer by fair share


class QueuePolicy:
    """Who goes first, what competes with what, what fits, and which auto-approval policy allows a request.

    Settings are read when a rule is applied (never cached on the object), so one module-level instance
    (`queue_policy`) serves every caller, tests that override settings included."""

    PRIORITY_RANK = {PriorityClass.PRODUCTION: 0, PriorityClass.STAGING: 1, PriorityClass.DEVELOPMENT: 2}
    SPEC_FIELDS = ("spec_kind", "product", "profile_name", "tier", "cluster_id")  # what spec_key() reads

    # --- Competition and fit -----------------------------------------------------------------------

    def spec_key(self, request: PoolRequest) -> tuple:
        """Requests with the same key compete for the same units."""
        return (request.spec_kind, request.product, request.profile_name, request.tier, request.cluster_id)

    def fits(self, request: PoolRequest, free: units.FreeUnits) -> bool:
        """Could approval take the request's units from `free` (on one cluster, or across clusters where it may)?"""
        return units.usable_free(request, free.by_cluster) >= request.count

    def approval_book(self) -> PolicyBook:
        """The enabled auto-approval policies, loaded once for a pass (PolicyBook.first_allowing)."""
        return PolicyBook()

    # --- Priority, aging, fair share ---------------------------------------------------------------

    def rank(self, request: PoolRequest) -> int:
        """The request's priority class as a rank: the lower, the sooner."""
        return self.PRIORITY_RANK[request.effective_priority]

    def aged_at(self, queued_at: dt.datetime) -> dt.datetime | None:
        """When a request queued at `queued_at` stops being ordered by fair share (None: never)."""
        limit = policy("QUEUE_AGED_AFTER_H")
        return queued_at + dt.timedelta(hours=limit) if limit else None

    def is_aged(self, queued_at: dt.datetime, now: dt.datetime) -> bool:
        at = self.aged_at(queued_at)
        return at is not None and at <= now

    def recent_gpu_hours(self, project_ids, *, now: dt.datetime | None = None) -> dict[int, float]:
        """GPU-hours each project reserved over the fair-share window (units weighted by capacity.mig.share).

        Held time is summed in SQL per (project, kind of unit); each unit's share (held_share, as billing and the
        screens count it) is applied here. A row released before it was allocated (a clock stepped back) holds
        nothing and is left out, so it cannot take hours off the others it is summed with.
        """
        now = now or timezone.now()
        since = now - dt.timedelta(hours=policy("QUEUE_FAIR_SHARE_WINDOW_H"))
        held = ExpressionWrapper(
            Least(Coalesce("released_at", Value(now)), Value(now)) - Greatest("allocated_at", Value(since)),
            output_field=DurationField(),
        )
        rows = (
            Allocation.objects.filter(project_id__in=project_ids, allocated_at__lt=now)
            .filter(Q(released_at__isnull=True) | Q(released_at__gt=since, released_at__gte=F("allocated_at")))
            .values("project_id", *SHARE_FIELDS)
            .annotate(held=Sum(held))
            .order_by()
        )
        hours: dict[int, float] = dict.fromkeys(project_ids, 0.0)
        for row in rows:
            share = held_share(*(row[field] for field in SHARE_FIELDS))
            hours[row["project_id"]] += row["held"].total_seconds() / 3600 * float(share)
        return hours

    def fair_shares(self, project_ids, *, now: dt.datetime | None = None) -> dict[int, float]:
        """Recent GPU-hours over the project's weight: the lower, the sooner it is served."""
        hours = self.recent_gpu_hours(project_ids, now=now)
        weights = dict(
            ProjectQueueWeight.objects.filter(project_id__in=project_ids).values_list("project_id", "weight")
        )
        return {pk: hours[pk] / float(weights.get(pk, 1)) for pk in hours}

    # --- Order -------------------------------------------------------------------------------------

    def order_key(self, entry: QueueEntry, *, share: float, aged: bool) -> tuple:
        """The sort key of a waiting entry: moved first (by rank), then class, then aged (by age alone), then
        fair share, then age."""
        return (
            entry.manual_rank is None,
            entry.manual_rank or 0,
            self.rank(entry.request),
            not aged,
            None if aged else share,
            entry.queued_at,
            entry.pk,
        )

    def ordered(self, *, now: dt.datetime | None = None, entries=None) -> list[Place]:
        """The waiting entries in queue order, with their position and the fair share that placed them."""
        if entries is None:
            entries = QueueEntry.objects.waiting().select_related("request__project", "operator_approved_by")
        entries = list(entries)
        now = now or timezone.now()
        shares = self.fair_shares({e.request.project_id for e in entries}, now=now)
        aged = {e.pk for e in entries if self.is_aged(e.queued_at, now)}
        entries.sort(key=lambda e: self.order_key(e, share=shares[e.request.project_id], aged=e.pk in aged))
        return [Place(e, i, shares[e.request.project_id], e.pk in aged) for i, e in enumerate(entries, start=1)]

    def position_of(self, request: PoolRequest) -> int | None:
        for place in self.ordered():
            if place.entry.request_id == request.pk:
                return place.position
        return None

    # --- Who overtakes whom (what the forecast runs forward) ---------------------------------------

    def ahead_of_newcomer(self, place: Place, *, rank: int, share: float) -> bool:
        """Is the waiting `place` served before a request of `rank` and fair share `share` that joins now? The
        order_key with the newcomer the youngest: moved entries, a higher class, and of its class the aged and
        those at a fair share no higher than its own."""
        mine = self.rank(place.entry.request)
        return (
            place.entry.manual_rank is not None
            or mine < rank
            or (mine == rank and (place.aged or place.fair_share <= share))
        )

    def reorders_with_age(self, place: Place, *, rank: int, aged_at: dt.datetime | None, moved: bool) -> bool:
        """Can the order of `place` against a request of `rank` (aged at `aged_at`, moved by an operator or not)
        change as they age? Only while neither was moved and both are of one class."""
        return (
            aged_at is not None
            and not moved
            and place.entry.manual_rank is None
            and self.rank(place.entry.request) == rank
        )

    def arrival_ahead(
        self, arrival: PoolRequest, request: PoolRequest, shares: dict, *, moved: bool
    ) -> tuple[bool, bool]:
        """Would `arrival`, arriving while `request` waits, rank ahead of it, and is that by fair share only (then
        not once `request` is aged)? Nothing ranks ahead of a request an operator moved; a later arrival of the
        same share is younger, so behind."""
        rank, mine = self.rank(arrival), self.rank(request)
        by_share = not moved and rank == mine and shares[arrival.project_id] < shares[request.project_id]
        return (not moved and rank < mine) or by_share, by_share


queue_policy = QueuePolicy()
