"""Who takes the units first: the waiting requests the queue serves before this one, and the requests expected to
arrive while it waits that rank ahead of it, both by the queue's own rules (scheduling.policy.QueuePolicy)."""

from __future__ import annotations

import bisect
import datetime as dt
import random
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Min

from pools.choices import RequestState
from pools.models import PoolRequest

from ..policy import queue_policy


@dataclass(frozen=True)
class Waiting:
    """A request the simulated queue serves before this one: its units, its workload (for its hold), and the
    end date at which it would leave the queue or, once started, release."""

    count: int
    project_id: int | None
    workload: str
    end_at: dt.datetime | None = None
    request_id: int | None = None
    hold_h: float | None = None  # known (`bench queue --forecast-bounds`); else drawn from the hold history
    # The queue's order moves with age (QueuePolicy.aged_at): a request behind this one now but older comes
    # ahead when it is aged (joins_at); one ahead now but younger falls behind when this one is (leaves_at).
    joins_at: dt.datetime | None = None
    leaves_at: dt.datetime | None = None


@dataclass(frozen=True)
class Arrival:
    """One request seen over the arrivals window, as a sample of what will arrive."""

    count: int
    project_id: int | None
    workload: str
    ahead: bool  # would rank ahead of the request being forecast
    auto: bool  # an auto-approval policy allows it: approved at submission when it fits
    hold_h: float | None = None  # known (`bench queue --forecast-bounds`); else drawn from the hold history
    by_share: bool = False  # ahead by fair share only: not once the request being forecast is aged
    # Known when a past request is replayed (scheduling/procurement.py): which request, and its declared end.
    request_id: int | None = None
    end_at: dt.datetime | None = None


@dataclass(frozen=True)
class Arrivals:
    """Later requests of the spec: `rate_h` of them per hour, each like one of `samples`."""

    rate_h: float
    samples: tuple[Arrival, ...]

    def next_after(self, t: dt.datetime, rng: random.Random) -> dt.datetime | None:
        """The next arrival after `t` (a Poisson process), or None when none are expected."""
        return t + dt.timedelta(hours=rng.expovariate(self.rate_h)) if self.rate_h else None

    def pick(self, rng: random.Random) -> Arrival:
        """What arrives (at the time next_after gave): one of the samples."""
        return rng.choice(self.samples)

    @property
    def ahead_per_h(self) -> float:
        if not self.samples:
            return 0.0
        return self.rate_h * sum(s.ahead for s in self.samples) / len(self.samples)


class KnownArrivals:
    """Arrivals known in advance, for Timeline.draw in place of Arrivals: each at its time, as its sample.
    `bench queue --forecast-bounds` gives the arrivals that did come; the procurement what-if replays the
    demand history (scheduling/procurement.py)."""

    def __init__(self, times: list[dt.datetime], samples: list[Arrival]):
        self.times, self.samples, self.next = times, samples, 0

    def next_after(self, t: dt.datetime, rng) -> dt.datetime | None:
        self.next = bisect.bisect_right(self.times, t)
        return self.times[self.next] if self.next < len(self.times) else None

    def pick(self, rng) -> Arrival:
        return self.samples[self.next]


def queue_ahead(request: PoolRequest, *, now: dt.datetime) -> list[Waiting]:
    """The waiting requests of the same spec that the queue serves before this one, in queue order, and
    those that will come ahead of it when they are aged (Waiting.joins_at).

    A queued request has them before its place; one not queued (a dry run) is placed as the queue would
    place it now: behind moved entries, those of a higher class, and those of its class that are aged or
    have a fair share at most its project's (they are older). Order by age (QueuePolicy.aged_at): while
    neither was moved and both are of one class, an older request behind it joins ahead when it is aged,
    and a younger one ahead of it by fair share falls behind when this one is aged.
    """
    policy = queue_policy
    key = policy.spec_key(request)
    places = [p for p in policy.ordered(now=now) if policy.spec_key(p.entry.request) == key and not p.entry.on_hold]
    mine = next((p for p in places if p.entry.request_id == request.pk and request.pk), None)
    rank = policy.rank(request)
    if mine is not None:
        before = [p for p in places if p.position < mine.position]
        queued_at, moved = mine.entry.queued_at, mine.entry.manual_rank is not None
    else:
        share = policy.fair_shares({request.project_id}, now=now)[request.project_id]
        before = [p for p in places if policy.ahead_of_newcomer(p, rank=rank, share=share)]
        queued_at, moved = now, False
    mine_aged_at = policy.aged_at(queued_at)

    def moves(p) -> bool:  # its order against this request can change with age
        return policy.reorders_with_age(p, rank=rank, aged_at=mine_aged_at, moved=moved)

    out = []
    ahead_ids = {p.entry.pk for p in before}
    for p in places:
        if p is mine:
            continue
        r = p.entry.request
        joins = leaves = None
        if p.entry.pk in ahead_ids:
            if mine is not None and moves(p) and p.entry.queued_at > queued_at:  # a dry run is the youngest
                leaves = mine_aged_at
        elif moves(p) and p.entry.queued_at < queued_at:
            joins = policy.aged_at(p.entry.queued_at)
        else:
            continue
        out.append(Waiting(r.count, r.project_id, r.workload_type, r.end_at, r.pk, joins_at=joins, leaves_at=leaves))
    return out


MIN_SPAN_H = 1.0


def arrivals(request: PoolRequest, *, now: dt.datetime, moved: bool = False) -> Arrivals:
    """Requests of the request's spec expected to arrive while it waits, at the rate seen over the last
    QUEUE_FORECAST_ARRIVALS_WINDOW_H (or since the first request, if later), each like one seen then.

    Each sample says whether it would rank ahead of `request` (a higher priority class, or its class from
    a project whose fair share is now lower, until `request` is aged; nothing ranks ahead of a request an
    operator moved) and whether an enabled auto-approval policy allows it (then it is approved at
    submission when it fits, whatever waits in the queue: scheduling.queue.after_submit).
    """
    policy = queue_policy
    window_h = settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H
    if window_h == 0:
        return Arrivals(0.0, ())
    since = now - dt.timedelta(hours=window_h)
    first = PoolRequest.objects.aggregate(first=Min("created_at"))["first"]
    if first is None:
        return Arrivals(0.0, ())
    # A rate over the last minutes of a young system would be noise: at least MIN_SPAN_H of observation.
    span_h = max((now - max(since, first)).total_seconds() / 3600, MIN_SPAN_H)
    rows = [
        r
        for r in PoolRequest.objects.filter(created_at__gt=since, created_at__lte=now)
        .exclude(state=RequestState.DRAFT)
        .exclude(pk=request.pk)
        .filter(spec_kind=request.spec_kind, product=request.product, profile_name=request.profile_name)
        .select_related("project")
        .only(
            "project__cost_centre",
            "count",
            "workload_type",
            "priority_class",
            "created_at",
            "start_at",
            "end_at",
            *policy.SPEC_FIELDS,
        )
        if policy.spec_key(r) == policy.spec_key(request)
    ]
    shares = policy.fair_shares({r.project_id for r in rows} | {request.project_id}, now=now)
    book = policy.approval_book()
    samples = []
    for r in rows:
        ahead, by_share = policy.arrival_ahead(r, request, shares, moved=moved)
        auto = book.first_allowing(r, r.created_at) is not None
        samples.append(Arrival(r.count, r.project_id, r.workload_type, ahead=ahead, auto=auto, by_share=by_share))
    samples = tuple(samples)
    return Arrivals(len(samples) / span_h, samples)
