"""When would a request start? P50 and P90 of its start, for a queued request or one not yet submitted.

estimate_start(request_like) takes a PoolRequest, saved or not (the API's dry run builds an unsaved
one), and combines:

- what is known: units free now, the units each holding pool of the same spec gives back at its
  end date, cluster-wide maintenance windows (a start that falls in one moves to its close), and a
  MIG reconfiguration of idle GPUs that would make room (units.reconfiguration_hint, done within
  QUEUE_FORECAST_RECONFIGURATION_S);
- what is observed: for a pool without an end date, its remaining hold is drawn from the hold times
  of released pools of the same project and workload type (else the workload type, else all pools,
  else QUEUE_FORECAST_DEFAULT_HOLD_H), given how long it has held already;
- the queue: the units that requests ahead of it (same spec, pools/queue_order.py) will take first,
  and the requests expected to arrive while it waits that would rank ahead of it: those of its spec
  submitted over the last QUEUE_FORECAST_ARRIVALS_WINDOW_H of a higher priority class, or of its class
  from projects whose fair share is now below its project's, arriving at the rate seen then (a Poisson
  process in each draw, sizes drawn from those seen);
- topology: a multi-GPU whole-GPU request starts only when one node has its count free
  (pools/topology.py), so units are followed per node.

QUEUE_FORECAST_DRAWS draws of that timeline (seeded, so one state gives one answer) give the start's
distribution; P50 and P90 are its quantiles. A request no unit would ever serve under the tier profile policy
(units.verdict) has no start ("never: tier 1 takes 3g and larger: ..."); units the policy withholds are
never counted as free, and are named in the basis ("withheld"). A start no draw reaches (more than the fleet holds)
is None. Accuracy is scored against actual starts by accuracy().
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import heapq
import random
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone

from capacity.choices import SpecKind
from capacity.models import MaintenanceWindow

from . import policies, topology, units
from .choices import RequestState
from .models import HOLDING_STATES, Allocation, GpuPool, PoolRequest
from .queue_models import QueueEntry
from .queue_order import PRIORITY_RANK, aged_at, fair_shares, ordered, spec_key


@dataclass(frozen=True)
class Forecast:
    p50: dt.datetime | None
    p90: dt.datetime | None
    basis: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Holder:
    units: int
    end_at: dt.datetime | None
    held_h: float
    history: Survival | None  # for a pool without an end date
    nodes: tuple[tuple[int, int], ...] = ()  # (node id, units there)
    pool_id: int | None = None
    project_id: int | None = None


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
    # The queue's order moves with age (queue_order.aged_at): a request behind this one now but older comes
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
    # Known when a past request is replayed (pools/procurement.py): which request, and its declared end.
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
    demand history (pools/procurement.py)."""

    def __init__(self, times: list[dt.datetime], samples: list[Arrival]):
        self.times, self.samples, self.next = times, samples, 0

    def next_after(self, t: dt.datetime, rng) -> dt.datetime | None:
        self.next = bisect.bisect_right(self.times, t)
        return self.times[self.next] if self.next < len(self.times) else None

    def pick(self, rng) -> Arrival:
        return self.samples[self.next]


def _matching_allocations(request: PoolRequest):
    queryset = Allocation.objects.active().filter(kind=request.spec_kind)
    if request.spec_kind == SpecKind.MIG:
        queryset = queryset.filter(profile_name=request.profile_name)
    if request.product:
        queryset = queryset.filter(product=request.product)
    if request.cluster_id:
        queryset = queryset.filter(gpu__node__cluster_id=request.cluster_id)  # the unit's own cluster
    return queryset.filter(pool__request__state__in=HOLDING_STATES)


class Survival:
    """Hold times seen, as a Kaplan-Meier survival curve: released pools are ended holds, pools still held
    count as holding at least as long as so far. Without the pools still held, the history would be
    biased short (the long holds of the window have not ended yet) and every forecast optimistic."""

    def __init__(self, observations: list[tuple[float, bool]]):
        self.ended = sum(1 for _, ended in observations if ended)
        self.times: list[float] = []
        self.survival: list[float] = []
        ended_holds = sorted(h for h, ended in observations if ended)
        self.mean = sum(ended_holds) / len(ended_holds) if ended_holds else 0.0
        at_risk, alive, i = len(observations), 1.0, 0
        ordered_obs = sorted(observations, key=lambda o: (o[0], not o[1]))  # at a tie, an end before a censoring
        while i < len(ordered_obs):
            hours, deaths, leaving = ordered_obs[i][0], 0, 0
            while i < len(ordered_obs) and ordered_obs[i][0] == hours:
                deaths += ordered_obs[i][1]
                leaving += 1
                i += 1
            if deaths:
                alive *= 1 - deaths / at_risk
                self.times.append(hours)
                self.survival.append(alive)
            at_risk -= leaving

    def _alive_at(self, hours: float) -> float:
        k = bisect.bisect_right(self.times, hours)
        return self.survival[k - 1] if k else 1.0

    def remaining(self, held: float, rng: random.Random) -> float:
        """A remaining hold (hours) for a pool held `held` hours so far: drawn from the curve past `held`;
        past the last hold seen to end, the mean hold again (memoryless), but at least
        QUEUE_FORECAST_OVERDUE_H."""
        target = rng.random() * self._alive_at(held)
        k = bisect.bisect_right(self.times, held)
        for t, alive in zip(self.times[k:], self.survival[k:], strict=True):
            if alive <= target:
                return t - held
        base = max(held, self.times[-1] if self.times else 0.0)
        extra = rng.expovariate(1 / self.mean) if self.mean > 0 else 0.0
        return max(base - held + extra, settings.QUEUE_FORECAST_OVERDUE_H)


def hold_history(*, now: dt.datetime | None = None, limit: int = 500) -> dict[tuple, Survival]:
    """Hold times (hours) of the last `limit` released pools and of every pool still held, keyed (project,
    workload), (workload,) and (): a Survival each."""
    now = now or timezone.now()
    fields = ("project_id", "workload_type", "created_at", "released_at")
    released = GpuPool.objects.filter(released_at__isnull=False).order_by("-released_at").values_list(*fields)
    held = GpuPool.objects.filter(released_at__isnull=True, created_at__lte=now).values_list(*fields)
    observations: dict[tuple, list[tuple[float, bool]]] = defaultdict(list)
    for project_id, workload, created, ended in [*released[:limit], *held]:
        hours = max(0.0, ((ended or now) - created).total_seconds() / 3600)
        for key in ((project_id, workload), (workload,), ()):
            observations[key].append((hours, ended is not None))
    return {key: Survival(rows) for key, rows in observations.items()}


def hold_samples(history: dict[tuple, Survival], project_id, workload: str) -> tuple[Survival | None, str]:
    minimum = settings.QUEUE_FORECAST_MIN_SAMPLES
    scopes = (((project_id, workload), "project and workload type"), ((workload,), "workload type"), ((), "all"))
    for key, scope in scopes:
        if key in history and history[key].ended >= minimum:
            return history[key], scope
    return None, "default"


def holders(request: PoolRequest, *, now: dt.datetime, history=None) -> tuple[list[Holder], dict]:
    """Pools holding units of the request's spec: how many units, their end date or hold history."""
    history = hold_history(now=now) if history is None else history
    rows = (
        _matching_allocations(request)
        .values(
            "pool_id",
            "pool__created_at",
            "pool__request__end_at",
            "pool__project_id",
            "pool__workload_type",
            "gpu__node_id",
        )
        .annotate(n=Count("pk"))
        .order_by("pool_id", "gpu__node_id")
    )
    by_pool: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_pool[row["pool_id"]].append(row)
    out, scopes = [], defaultdict(int)
    for parts in by_pool.values():
        row = parts[0]
        samples, scope = (None, "end date")
        if row["pool__request__end_at"] is None:
            samples, scope = hold_samples(history, row["pool__project_id"], row["pool__workload_type"])
        scopes[scope] += 1
        held = max(0.0, (now - row["pool__created_at"]).total_seconds() / 3600)
        nodes = tuple((part["gpu__node_id"], part["n"]) for part in parts)
        units_held = sum(n for _, n in nodes)
        end_at, project = row["pool__request__end_at"], row["pool__project_id"]
        out.append(Holder(units_held, end_at, held, samples, nodes, row["pool_id"], project))
    return out, dict(scopes)


def queue_ahead(request: PoolRequest, *, now: dt.datetime) -> list[Waiting]:
    """The waiting requests of the same spec that the queue serves before this one, in queue order, and
    those that will come ahead of it when they are aged (Waiting.joins_at).

    A queued request has them before its place; one not queued (a dry run) is placed as the queue would
    place it now: behind moved entries, those of a higher class, and those of its class that are aged or
    have a fair share at most its project's (they are older). Order by age (queue_order.aged_at): while
    neither was moved and both are of one class, an older request behind it joins ahead when it is aged,
    and a younger one ahead of it by fair share falls behind when this one is aged.
    """
    key = spec_key(request)
    places = [p for p in ordered(now=now) if spec_key(p.entry.request) == key and not p.entry.on_hold]
    mine = next((p for p in places if p.entry.request_id == request.pk and request.pk), None)
    rank = PRIORITY_RANK[request.effective_priority]
    if mine is not None:
        before = [p for p in places if p.position < mine.position]
        queued_at, moved = mine.entry.queued_at, mine.entry.manual_rank is not None
    else:
        share = fair_shares({request.project_id}, now=now)[request.project_id]
        before = [
            p
            for p in places
            if p.entry.manual_rank is not None
            or PRIORITY_RANK[p.entry.request.effective_priority] < rank
            or (PRIORITY_RANK[p.entry.request.effective_priority] == rank and (p.aged or p.fair_share <= share))
        ]
        queued_at, moved = now, False
    mine_aged_at = aged_at(queued_at)

    def moves(p) -> bool:  # its order against this request can change with age
        same_class = PRIORITY_RANK[p.entry.request.effective_priority] == rank
        return mine_aged_at is not None and not moved and p.entry.manual_rank is None and same_class

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
            joins = aged_at(p.entry.queued_at)
        else:
            continue
        out.append(Waiting(r.count, r.project_id, r.workload_type, r.end_at, r.pk, joins_at=joins, leaves_at=leaves))
    return out


MIN_SPAN_H = 1.0
SPEC_FIELDS = ("spec_kind", "product", "profile_name", "tier", "cluster_id")  # what spec_key() reads


def arrivals(request: PoolRequest, *, now: dt.datetime, moved: bool = False) -> Arrivals:
    """Requests of the request's spec expected to arrive while it waits, at the rate seen over the last
    QUEUE_FORECAST_ARRIVALS_WINDOW_H (or since the first request, if later), each like one seen then.

    Each sample says whether it would rank ahead of `request` (a higher priority class, or its class from
    a project whose fair share is now lower, until `request` is aged; nothing ranks ahead of a request an
    operator moved) and whether an enabled auto-approval policy allows it (then it is approved at
    submission when it fits, whatever waits in the queue: pools.queue.after_submit).
    """
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
            *SPEC_FIELDS,
        )
        if spec_key(r) == spec_key(request)
    ]
    mine = PRIORITY_RANK[request.effective_priority]
    shares = fair_shares({r.project_id for r in rows} | {request.project_id}, now=now)
    book = policies.PolicyBook()

    def by_share(r: PoolRequest) -> bool:
        rank = PRIORITY_RANK[r.effective_priority]
        return not moved and rank == mine and shares[r.project_id] < shares[request.project_id]

    samples = tuple(
        Arrival(
            r.count,
            r.project_id,
            r.workload_type,
            ahead=(not moved and PRIORITY_RANK[r.effective_priority] < mine) or by_share(r),
            auto=book.first_allowing(r, r.created_at) is not None,
            by_share=by_share(r),
        )
        for r in rows
    )
    return Arrivals(len(samples) / span_h, samples)


def _remaining_h(holder: Holder, rng: random.Random | None) -> float:
    if holder.history is None:
        return max(settings.QUEUE_FORECAST_DEFAULT_HOLD_H - holder.held_h, settings.QUEUE_FORECAST_OVERDUE_H)
    return holder.history.remaining(holder.held_h, rng)


def _after_maintenance(start: dt.datetime, windows: list[MaintenanceWindow]) -> dt.datetime:
    for _ in range(len(windows) + 1):  # each move may land in another window
        moved = False
        for window in windows:
            for opens, closes in window.occurrences(start):
                if opens <= start < closes:
                    start, moved = closes, True
        if not moved:
            break
    return start


def _quantile(values: list[dt.datetime | None], q: float) -> dt.datetime | None:
    """The q-quantile (nearest rank) of the draws; None ranks last (never reached)."""
    never = dt.datetime.max.replace(tzinfo=dt.UTC)
    ranked = sorted(values, key=lambda v: never if v is None else v)
    return ranked[min(len(ranked) - 1, max(0, int(round(q * len(ranked) + 0.5)) - 1))]


class Units:
    """Free units by node in one draw, taken as approval takes them (pools/topology.py, pools/units.py): a
    multi-GPU whole-GPU request on the one node with the fewest left over, anything else from the
    lowest node id up; one whole GPU first on a node no other project holds units on (units._dedicated_first),
    so Units keeps which projects hold units on each node. Specs that need no single node are counted on one
    place (node 0).

    A draw takes and gives units thousands of times over a fleet's nodes: per node, the nodes are also kept
    by their free count (`_by_free`: count -> node ids, sorted), so the best fit is found among the few
    counts a node can have instead of scanning every node at every step."""

    def __init__(self, free: dict[int, int], per_node: bool):
        self.free = dict(sorted(free.items()))
        self.total = sum(self.free.values())
        self.per_node = per_node
        self._by_free: dict[int, list[int]] = defaultdict(list)
        self.owners: dict[int, Counter] = defaultdict(Counter)  # per node: units held by project
        if per_node:
            for node, n in self.free.items():  # in node order: each list is sorted
                if n > 0:
                    self._by_free[n].append(node)

    def copy(self) -> Units:
        other = Units.__new__(Units)
        other.free, other.total, other.per_node = dict(self.free), self.total, self.per_node
        other._by_free = defaultdict(list, {n: list(nodes) for n, nodes in self._by_free.items() if nodes})
        other.owners = defaultdict(Counter, {n: Counter(c) for n, c in self.owners.items() if c})
        return other

    def own(self, nodes: tuple[tuple[int, int], ...], project_id, sign: int = 1) -> None:
        """Note units held (sign 1) or given back (-1) by `project_id` on their nodes."""
        if self.per_node:
            for node, k in nodes:
                held = self.owners[node]
                held[project_id] += sign * k
                if held[project_id] <= 0:
                    del held[project_id]

    def _dedicated(self, project_id) -> int | None:
        """The lowest node with a free unit and no other project's units, else the lowest with a free unit."""
        first = None
        for node, n in self.free.items():
            if n:
                if not any(p != project_id for p in self.owners.get(node, ())):
                    return node
                first = node if first is None else first
        return first

    def _set(self, node: int, n: int) -> None:
        if self.per_node:
            old = self.free.get(node, 0)
            if old > 0:
                nodes = self._by_free[old]
                del nodes[bisect.bisect_left(nodes, node)]
            if n > 0:
                bisect.insort(self._by_free[n], node)
        self.free[node] = n

    def take(self, count: int, project_id=None) -> tuple[tuple[int, int], ...] | None:
        """The (node, units) taken for a request of `count` of `project_id`, or None (nothing taken) when it
        does not fit."""
        if self.per_node and count == 1:
            node = self._dedicated(project_id)
            if node is None:
                return None
            taken = ((node, 1),)
        elif self.per_node and count > 1:
            fitting = sorted(n for n, nodes in self._by_free.items() if n >= count and nodes)
            if not fitting:
                return None
            node = self._by_free[fitting[0]][0]  # the fewest left over, then the lowest node id
            taken = ((node, count),)
        elif self.total < count:
            return None
        else:
            taken, left = [], count
            for node, n in self.free.items():
                if not left:
                    break
                if n:
                    k = min(n, left)
                    taken.append((node, k))
                    left -= k
            taken = tuple(taken)
        for node, k in taken:
            self._set(node, self.free[node] - k)
        self.total -= count
        self.own(taken, project_id)
        return taken

    def give(self, nodes: tuple[tuple[int, int], ...], project_id=None) -> None:
        self.own(nodes, project_id, -1)
        new = False
        for node, k in nodes:
            new = new or node not in self.free
            self._set(node, self.free.get(node, 0) + k)
            self.total += k
        if new:  # keep the first-fit order: by node id, as approval takes them
            self.free = dict(sorted(self.free.items()))

    def fits(self, count: int) -> bool:
        if self.per_node and count > 1:
            return any(nodes for n, nodes in self._by_free.items() if n >= count)
        return self.total >= count


@dataclass
class Timeline:
    """What one draw starts from: units free now, holders, the queue ahead (and those that will join it or
    leave it with age), arrivals, hold history, and when the request is aged (arrivals ahead by fair
    share overtake it only until then)."""

    now: dt.datetime
    horizon: dt.datetime
    count: int
    units: Units
    holders: list[Holder]
    ahead: list[Waiting]
    coming: Arrivals
    history: dict[tuple, Survival]
    aged_at: dt.datetime | None = None

    def hold_h(self, project_id, workload: str, rng: random.Random, known: float | None = None) -> float:
        if known is not None:
            return known
        survival, _ = hold_samples(self.history, project_id, workload)
        return survival.remaining(0.0, rng) if survival is not None else settings.QUEUE_FORECAST_DEFAULT_HOLD_H

    def with_units(self, extra: dict[int, int]) -> Timeline:
        """This timeline with `extra` units on more nodes (node id: units), hypothetical GPUs for the
        procurement what-if (pools/procurement.py); ids must be new."""
        more = self.units.copy()
        for node, k in sorted(extra.items()):
            if node in more.free:
                raise ValueError(f"node {node} already has units")
            more.give(((node, k),))
        return dataclasses.replace(self, units=more)

    def draw(self, rng: random.Random, started: Callable | None = None) -> dt.datetime | None:
        """One future, run as the queue runs it: at every release the queue's pass serves the requests
        ahead in order while the head fits (a head that does not fit blocks the rest of the spec); an
        arrival an auto-approval policy allows takes units at submission when it fits, one that does not
        fit and ranks ahead joins the queue ahead. With age the order moves: an older request joins the
        queue ahead when it is aged, a younger one ahead by fair share leaves it when this one is. The
        start is the first pass that reaches this request with its units free; None past the horizon.

        `started(item, t, release)`, when given, is told each Waiting or Arrival that takes its units, when,
        and until when: the procurement what-if replays a whole window this way (pools/procurement.py; a count
        no place holds runs the draw to the horizon)."""
        units, hour = self.units.copy(), dt.timedelta(hours=1)
        for holder in self.holders:
            units.own(holder.nodes, holder.project_id)
        queue = deque(w for w in self.ahead if w.joins_at is None)
        joining = deque(sorted((w for w in self.ahead if w.joins_at is not None), key=lambda w: w.joins_at))
        # How many in the queue fall behind when this request is aged: counted, not re-read at every step, as a
        # draw runs thousands of steps over a queue that grows with arrivals (O(n) a step made draws quadratic).
        leaving = sum(w.leaves_at is not None for w in queue)
        fixed, drawn = self._holder_releases
        releases = fixed + [
            (self.now + h.history.remaining(h.held_h, rng) * hour, i, h.nodes, h.project_id) for i, h in drawn
        ]
        heapq.heapify(releases)
        seq = len(releases)
        arrival = self.coming.next_after(self.now, rng)
        t = self.now
        while True:
            while joining and joining[0].joins_at <= t:
                queue.append(joining.popleft())
            if leaving and self.aged_at is not None and t >= self.aged_at:
                queue = deque(w for w in queue if w.leaves_at is None or w.leaves_at > t)
                leaving = sum(w.leaves_at is not None for w in queue)
            while queue:  # the pass
                head = queue[0]
                if head.end_at is not None and head.end_at <= t:  # its end came while it waited
                    leaving -= queue.popleft().leaves_at is not None
                    continue
                taken = units.take(head.count, head.project_id)
                if taken is None:
                    break
                leaving -= queue.popleft().leaves_at is not None
                seq += 1
                release = head.end_at or t + self.hold_h(head.project_id, head.workload, rng, head.hold_h) * hour
                if started is not None:
                    started(head, t, release)
                heapq.heappush(releases, (release, seq, taken, head.project_id))
            if not queue and units.fits(self.count):
                return t
            reorder = [joining[0].joins_at] if joining else []
            if leaving:
                reorder.append(self.aged_at)
            reorder_at = min(reorder, default=None)
            released_at = releases[0][0] if releases else None
            nxt = min((x for x in (arrival, released_at, reorder_at) if x is not None), default=None)
            if nxt is None:
                return None
            t = max(nxt, self.now)
            if t > self.horizon:
                return None
            if nxt == released_at:  # a release before an arrival at the same instant
                _, _, nodes, project = heapq.heappop(releases)
                units.give(nodes, project)
            elif nxt == arrival:
                sample = self.coming.pick(rng)
                taken = units.take(sample.count, sample.project_id) if sample.auto else None
                if taken is not None:
                    seq += 1
                    hold = self.hold_h(sample.project_id, sample.workload, rng, sample.hold_h)
                    release = sample.end_at or t + hold * hour
                    if started is not None:
                        started(sample, t, release)
                    heapq.heappush(releases, (release, seq, taken, sample.project_id))
                elif self._ranks_ahead(sample, t) and not units.fits(sample.count):
                    queue.append(
                        Waiting(
                            sample.count,
                            sample.project_id,
                            sample.workload,
                            end_at=sample.end_at,
                            request_id=sample.request_id,
                            hold_h=sample.hold_h,
                        )
                    )
                arrival = self.coming.next_after(t, rng)
            # else the queue's order moved (joining, leaving): the next pass serves it

    @cached_property
    def _holder_releases(self) -> tuple[list[tuple], list[tuple[int, Holder]]]:
        """The holders' releases that are the same in every draw (an end date, or the default hold), as heap
        entries, and the holders whose release each draw draws from their hold history, in holder order (so
        the draws take the same random numbers in the same order as when every holder was read each draw)."""
        hour, fixed, drawn = dt.timedelta(hours=1), [], []
        for i, h in enumerate(self.holders):
            if h.end_at is not None:
                fixed.append((h.end_at, i, h.nodes, h.project_id))
            elif h.history is None:
                fixed.append((self.now + _remaining_h(h, None) * hour, i, h.nodes, h.project_id))
            else:
                drawn.append((i, h))
        return fixed, drawn

    def _ranks_ahead(self, sample: Arrival, t: dt.datetime) -> bool:
        return sample.ahead and not (sample.by_share and self.aged_at is not None and t >= self.aged_at)


def _units_now(request: PoolRequest, free: int, holders: list[Holder]) -> tuple[Units, dict[int, int]]:
    """Free units (Units) and the most units one place could ever hold (node capacity) for the request."""
    per_node = request.spec_kind == SpecKind.FULL
    if not per_node:
        return Units({0: free}, False), {0: free + sum(h.units for h in holders)}
    node_free = {n: k for n, (_, k) in topology.free_by_node(units.full_candidates(request)).items()}
    capacity = dict(node_free)
    for holder in holders:
        for node, k in holder.nodes:
            capacity[node] = capacity.get(node, 0) + k
    return Units(node_free, True), capacity


@dataclass
class Plan:
    """What estimate_start draws from: the timeline (None when the answer needs no draws: `forecast`), a MIG
    reconfiguration that would make room by `reconfigured`, the maintenance windows a start moves past."""

    basis: dict
    forecast: Forecast | None = None
    timeline: Timeline | None = None
    reconfigured: dt.datetime | None = None
    windows: list = field(default_factory=list)

    def draw(self, rng: random.Random, timeline: Timeline | None = None) -> dt.datetime | None:
        """One draw's start; `timeline` replaces the plan's (`bench queue --forecast-bounds` gives it known futures)."""
        start = (timeline or self.timeline).draw(rng)
        if self.reconfigured is not None and (start is None or self.reconfigured < start):
            start = self.reconfigured
        return None if start is None else _after_maintenance(start, self.windows)


def plan(request: PoolRequest, *, now: dt.datetime, history=None) -> Plan:
    """Read what the forecast of `request` (saved or not) rests on; see the module docstring."""
    free_by_cluster = units.free_by_cluster(request)
    free = units.usable_free(request, free_by_cluster)
    waiting = queue_ahead(request, now=now)
    ahead = [w for w in waiting if w.joins_at is None]
    history = hold_history(now=now) if history is None else history
    found, scopes = holders(request, now=now, history=history)
    basis: dict = {
        "free_now": free,
        "need": request.count,
        "ahead": sum(w.count for w in ahead),
        "holders": len(found),
        "holders_by_basis": scopes,
        "reconfiguration": None,
        "maintenance_windows": 0,
    }
    if free >= request.count and not ahead:
        start = max(now, request.start_at) if request.start_at else now
        return Plan(basis, forecast=Forecast(start, start, {**basis, "why": "fits now"}))
    answer = units.verdict(request, units.FreeUnits(free_by_cluster))  # the units the tier policy withholds
    basis["withheld"] = {"units": answer.withheld, "reason": answer.reason}
    if not answer.servable:
        return Plan(basis, forecast=Forecast(None, None, {**basis, "why": f"never: {answer.refusal}"}))
    reconfigured = None
    if request.spec_kind == SpecKind.MIG and not ahead:
        hint = units.reconfiguration_hint(request, free_by_cluster)
        if hint and hint["meets_request"]:
            reconfigured = now + dt.timedelta(seconds=settings.QUEUE_FORECAST_RECONFIGURATION_S)
            basis["reconfiguration"] = hint
    windows = list(MaintenanceWindow.objects.enabled().filter(node_group=""))
    if request.cluster_id:
        windows = [w for w in windows if w.cluster_id == request.cluster_id]
    basis["maintenance_windows"] = len(windows)
    entry = QueueEntry.objects.filter(request_id=request.pk).first() if request.pk else None
    moved = entry is not None and entry.manual_rank is not None  # an operator's place: nothing overtakes it
    coming = arrivals(request, now=now, moved=moved)
    basis["arrivals_per_h"] = round(coming.rate_h, 3)
    basis["arrivals_ahead_per_h"] = round(coming.ahead_per_h, 3)
    free_units, capacity = _units_now(request, free, found)
    largest = max(capacity.values(), default=0) if free_units.per_node and request.count > 1 else sum(capacity.values())
    if largest < request.count:  # more than the fleet (or any one node) holds: never
        why = "more than the fleet holds" + (f"; {answer.withheld_sentence()}" if answer.withheld else "")
        return Plan(basis, forecast=Forecast(None, None, {**basis, "why": why}))
    if not free_units.per_node:
        found = [dataclasses.replace(h, nodes=((0, h.units),)) for h in found]
    timeline = Timeline(
        now=now,
        horizon=now + dt.timedelta(hours=settings.QUEUE_FORECAST_HORIZON_H),
        count=request.count,
        units=free_units,
        holders=found,
        ahead=waiting,
        coming=coming,
        history=history,
        aged_at=None if moved else aged_at(entry.queued_at if entry is not None else now),
    )
    basis["why"] = "the queue run forward over releases and arrivals"
    return Plan(basis, timeline=timeline, reconfigured=reconfigured, windows=windows)


def estimate_start(request: PoolRequest, *, now: dt.datetime | None = None, history=None) -> Forecast:
    """P50 and P90 of when `request` (saved or not) would start, and what the estimate rests on."""
    return quantiles(plan(request, now=now or timezone.now(), history=history))


def quantiles(planned: Plan, timeline: Timeline | None = None, *, n: int | None = None) -> Forecast:
    """P50 and P90 over QUEUE_FORECAST_DRAWS (or `n`) seeded draws of the plan (of `timeline`, when given)."""
    if planned.forecast is not None:
        return planned.forecast
    rng = random.Random(settings.QUEUE_FORECAST_SEED)
    draws = [planned.draw(rng, timeline) for _ in range(n or settings.QUEUE_FORECAST_DRAWS)]
    basis = dict(planned.basis)
    p50 = _quantile(draws, 0.5)
    if p50 is not None:  # how far the draws fall from their P50: the error this forecast itself expects
        basis["spread_h"] = round(
            sum(abs((d - p50).total_seconds()) / 3600 for d in draws if d is not None) / len(draws), 3
        )
    return Forecast(p50, _quantile(draws, 0.9), basis)


def accuracy(*, since: dt.datetime | None = None) -> dict:
    """Predicted (first P50) against actual start for every request approved out of the queue.

    mae_ratio is the mean absolute error over the mean actual wait, the figure `bench queue` reports.
    The actual start is the approval onto the request's own units, what the forecast predicts (it counts
    units that free for the request, never lent units, which are preemptible and promised to no one).
    A request that ran on lent units before (QueueEntry.first_on_loan_at) is scored the same way and
    counted in `ran_on_loan_first`, with its mean wait until lent units covered it (`mean_wait_to_loan_h`).
    A request that started although its first forecast found no start within QUEUE_FORECAST_HORIZON_H (P50
    None) cannot be scored: `without_forecast` counts them, so none is left out unseen.
    """
    rows = QueueEntry.objects.started()
    unscored = QueueEntry.objects.filter(request__approved_at__isnull=False, first_p50__isnull=True)
    if since is not None:
        rows = rows.filter(request__approved_at__gte=since)
        unscored = unscored.filter(request__approved_at__gte=since)
    without_forecast = unscored.count()
    errors, waits, inside_p90, loan_waits = [], [], 0, []
    for queued, p50, p90, started, on_loan in rows.values_list(
        "queued_at", "first_p50", "first_p90", "request__approved_at", "first_on_loan_at"
    ):
        errors.append(abs((started - p50).total_seconds()) / 3600)
        waits.append(max(0.0, (started - queued).total_seconds() / 3600))
        inside_p90 += p90 is not None and started <= p90
        if on_loan is not None and on_loan < started:
            loan_waits.append(max(0.0, (on_loan - queued).total_seconds() / 3600))
    if not errors:
        return {
            "started": 0,
            "mae_h": None,
            "mean_wait_h": None,
            "mae_ratio": None,
            "within_p90": None,
            "ran_on_loan_first": 0,
            "mean_wait_to_loan_h": None,
            "without_forecast": without_forecast,
        }
    mean_wait = sum(waits) / len(waits)
    mae = sum(errors) / len(errors)
    return {
        "started": len(errors),
        "mae_h": round(mae, 3),
        "mean_wait_h": round(mean_wait, 3),
        "mae_ratio": round(mae / mean_wait, 3) if mean_wait > 0 else None,
        "within_p90": round(inside_p90 / len(errors), 3),
        "ran_on_loan_first": len(loan_waits),
        "mean_wait_to_loan_h": round(sum(loan_waits) / len(loan_waits), 3) if loan_waits else None,
        "without_forecast": without_forecast,
    }
