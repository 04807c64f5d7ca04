"""One future of the queue, drawn: free units by node (Units) and the timeline a draw runs (Timeline), as the
queue's pass (scheduling/queue.py) and approval (pools/units/, pools/units/topology.py) would run it."""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import heapq
import random
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from django.conf import settings

from .demand import Arrival, Arrivals, Waiting
from .history import Holder, Survival, hold_samples, remaining_h


class Units:
    """Free units by node in one draw, taken as approval takes them (pools/units/topology.py, pools/units/): a
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
        procurement what-if (scheduling/procurement.py); ids must be new."""
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
        and until when: the procurement what-if replays a whole window this way (scheduling/procurement.py; a count
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
                fixed.append((self.now + remaining_h(h, None) * hour, i, h.nodes, h.project_id))
            else:
                drawn.append((i, h))
        return fixed, drawn

    def _ranks_ahead(self, sample: Arrival, t: dt.datetime) -> bool:
        return sample.ahead and not (sample.by_share and self.aged_at is not None and t >= self.aged_at)
