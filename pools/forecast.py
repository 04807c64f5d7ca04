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
distribution; P50 and P90 are its quantiles. A start no draw reaches (more than the fleet holds)
is None. Accuracy is scored against actual starts by accuracy().
"""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone

from capacity.choices import SpecKind
from capacity.models import MaintenanceWindow

from . import topology, units
from .choices import RequestState
from .models import HOLDING_STATES, Allocation, GpuPool, PoolRequest
from .queue_models import QueueEntry
from .queue_order import PRIORITY_RANK, fair_shares, ordered, spec_key


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
    history: tuple[float, ...]
    nodes: tuple[tuple[int, int], ...] = ()  # (node id, units there)


@dataclass(frozen=True)
class Arrivals:
    """Later requests expected to rank ahead: `rate_h` of them per hour, of the sizes in `counts`."""

    rate_h: float
    counts: tuple[int, ...]


def _matching_allocations(request: PoolRequest):
    queryset = Allocation.objects.active().filter(kind=request.spec_kind)
    if request.spec_kind == SpecKind.MIG:
        queryset = queryset.filter(profile_name=request.profile_name)
    if request.product:
        queryset = queryset.filter(product=request.product)
    if request.cluster_id:
        queryset = queryset.filter(pool__cluster_id=request.cluster_id)
    return queryset.filter(pool__request__state__in=HOLDING_STATES)


def hold_history(*, limit: int = 500) -> dict[tuple, list[float]]:
    """Observed hold times (hours) of released pools, keyed (project, workload), (workload,) and ()."""
    rows = (
        GpuPool.objects.filter(released_at__isnull=False)
        .order_by("-released_at")
        .values_list("project_id", "workload_type", "created_at", "released_at")[:limit]
    )
    history: dict[tuple, list[float]] = defaultdict(list)
    for project_id, workload, created, released in rows:
        hours = max(0.0, (released - created).total_seconds() / 3600)
        history[(project_id, workload)].append(hours)
        history[(workload,)].append(hours)
        history[()].append(hours)
    return history


def _samples(history: dict[tuple, list[float]], project_id, workload: str) -> tuple[tuple[float, ...], str]:
    minimum = settings.QUEUE_FORECAST_MIN_SAMPLES
    scopes = (((project_id, workload), "project and workload type"), ((workload,), "workload type"), ((), "all"))
    for key, scope in scopes:
        if len(history.get(key, ())) >= minimum:
            return tuple(sorted(history[key])), scope
    return (), "default"


def holders(request: PoolRequest, *, now: dt.datetime, history=None) -> tuple[list[Holder], dict]:
    """Pools holding units of the request's spec: how many units, their end date or hold history."""
    history = hold_history() if history is None else history
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
        samples, scope = ((), "end date")
        if row["pool__request__end_at"] is None:
            samples, scope = _samples(history, row["pool__project_id"], row["pool__workload_type"])
        scopes[scope] += 1
        held = max(0.0, (now - row["pool__created_at"]).total_seconds() / 3600)
        nodes = tuple((part["gpu__node_id"], part["n"]) for part in parts)
        out.append(Holder(sum(n for _, n in nodes), row["pool__request__end_at"], held, samples, nodes))
    return out, dict(scopes)


def demand_ahead(request: PoolRequest, *, now: dt.datetime) -> int:
    """Units that waiting requests of the same spec ahead of this one will take first.

    A queued request counts those before it in the queue; one not queued (a dry run) counts every
    waiting request of its spec in its priority class or a higher one.
    """
    key = spec_key(request)
    places = [p for p in ordered(now=now) if spec_key(p.entry.request) == key and not p.entry.on_hold]
    mine = next((p for p in places if p.entry.request_id == request.pk and request.pk), None)
    if mine is not None:
        return sum(p.entry.request.count for p in places if p.position < mine.position)
    rank = PRIORITY_RANK[request.effective_priority]
    return sum(p.entry.request.count for p in places if PRIORITY_RANK[p.entry.request.effective_priority] <= rank)


MIN_SPAN_H = 1.0
SPEC_FIELDS = ("spec_kind", "product", "profile_name", "tier", "cluster_id")  # what spec_key() reads


def arrivals_ahead(request: PoolRequest, *, now: dt.datetime) -> Arrivals:
    """Requests of the request's spec expected to arrive while it waits and rank ahead of it, at the rate
    seen over the last QUEUE_FORECAST_ARRIVALS_WINDOW_H (or since the first request, if later).

    Ahead: a higher priority class, or the same class from a project whose fair share is now lower
    (pools/queue_order.py). Nothing arrives ahead of a request an operator moved.
    """
    window_h = settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H
    entry = QueueEntry.objects.filter(request_id=request.pk).first() if request.pk else None
    if window_h == 0 or (entry is not None and entry.manual_rank is not None):
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
        .exclude(project_id=request.project_id)
        .filter(spec_kind=request.spec_kind, product=request.product, profile_name=request.profile_name)
        .only("project_id", "count", "workload_type", "priority_class", *SPEC_FIELDS)
        if spec_key(r) == spec_key(request)
    ]
    mine = PRIORITY_RANK[request.effective_priority]
    shares = fair_shares({r.project_id for r in rows} | {request.project_id}, now=now)
    ahead = [
        r.count
        for r in rows
        if PRIORITY_RANK[r.effective_priority] < mine
        or (PRIORITY_RANK[r.effective_priority] == mine and shares[r.project_id] < shares[request.project_id])
    ]
    return Arrivals(len(ahead) / span_h, tuple(sorted(ahead)))


def _remaining_h(holder: Holder, rng: random.Random) -> float:
    if not holder.history:
        return max(settings.QUEUE_FORECAST_DEFAULT_HOLD_H - holder.held_h, settings.QUEUE_FORECAST_OVERDUE_H)
    longer = [h for h in holder.history if h > holder.held_h]
    if not longer:  # held longer than anything seen: expect it soon
        return settings.QUEUE_FORECAST_OVERDUE_H
    return rng.choice(longer) - holder.held_h


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


def estimate_start(request: PoolRequest, *, now: dt.datetime | None = None, history=None) -> Forecast:
    """P50 and P90 of when `request` (saved or not) would start, and what the estimate rests on."""
    now = now or timezone.now()
    free_by_cluster = units.free_by_cluster(request)
    free = units.usable_free(request, free_by_cluster)
    ahead = demand_ahead(request, now=now)
    need = request.count + ahead
    found, scopes = holders(request, now=now, history=history)
    basis: dict = {
        "free_now": free,
        "need": request.count,
        "ahead": ahead,
        "holders": len(found),
        "holders_by_basis": scopes,
        "reconfiguration": None,
        "maintenance_windows": 0,
    }
    if free >= need:
        start = max(now, request.start_at) if request.start_at else now
        return Forecast(start, start, {**basis, "why": "fits now"})
    reconfigured = None
    if request.spec_kind == SpecKind.MIG and ahead == 0:
        hint = units.reconfiguration_hint(request, free_by_cluster)
        if hint and hint["meets_request"]:
            reconfigured = now + dt.timedelta(seconds=settings.QUEUE_FORECAST_RECONFIGURATION_S)
            basis["reconfiguration"] = hint
    windows = list(MaintenanceWindow.objects.enabled().filter(node_group=""))
    if request.cluster_id:
        windows = [w for w in windows if w.cluster_id == request.cluster_id]
    basis["maintenance_windows"] = len(windows)
    coming = arrivals_ahead(request, now=now)
    basis["arrivals_ahead_per_h"] = round(coming.rate_h, 3)
    per_node = topology.one_node(request)
    node_free = (
        {n: free for n, (_, free) in topology.free_by_node(units.full_candidates(request)).items()} if per_node else {}
    )
    total_free = sum(node_free.values()) if per_node else free
    supply = total_free + sum(h.units for h in found)
    rng = random.Random(settings.QUEUE_FORECAST_SEED)
    draws: list[dt.datetime | None] = []
    for _ in range(settings.QUEUE_FORECAST_DRAWS):
        events = sorted(
            (h.end_at if h.end_at is not None else now + dt.timedelta(hours=_remaining_h(h, rng)), h.units, h.nodes)
            for h in found
        )
        have, wanted, start = total_free, need, None
        on_node, best = dict(node_free), max(node_free.values(), default=0)
        arrival = now + dt.timedelta(hours=rng.expovariate(coming.rate_h)) if coming.rate_h else None
        for at, n, nodes in events:
            while arrival is not None and arrival <= at:  # a later request ranking ahead takes units first
                wanted += rng.choice(coming.counts)
                arrival = arrival + dt.timedelta(hours=rng.expovariate(coming.rate_h)) if wanted <= supply else None
            if wanted > supply:  # more than every holder gives back: not reached
                break
            have += n
            for node, k in nodes if per_node else ():
                on_node[node] = on_node.get(node, 0) + k
                best = max(best, on_node[node])
            if have >= wanted and (not per_node or best >= request.count):
                start = max(at, now)
                break
        if reconfigured is not None and (start is None or reconfigured < start):
            start = reconfigured
        draws.append(None if start is None else _after_maintenance(start, windows))
    basis["why"] = "releases of current holders"
    return Forecast(_quantile(draws, 0.5), _quantile(draws, 0.9), basis)


def accuracy(*, since: dt.datetime | None = None) -> dict:
    """Predicted (first P50) against actual start for every request approved out of the queue.

    mae_ratio is the mean absolute error over the mean actual wait, the figure `bench queue` reports.
    The actual start is the approval onto the request's own units, what the forecast predicts (it counts
    units that free for the request, never lent units, which are preemptible and promised to no one).
    A request that ran on lent units before (QueueEntry.first_on_loan_at) is scored the same way and
    counted in `ran_on_loan_first`, with its mean wait until lent units covered it (`mean_wait_to_loan_h`).
    """
    rows = QueueEntry.objects.started()
    if since is not None:
        rows = rows.filter(request__approved_at__gte=since)
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
    }
