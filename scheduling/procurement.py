"""Procurement what-if: with N more GPUs of product P in tier T, what would the queue's waits have been?

what_if() replays the demand history of one spec (the requests of the last `window_days` that were approved
or queued) through the start forecast's own queue model (scheduling/forecast Timeline.draw: the queue's pass
over releases and arrivals, whole-GPU requests on one node, auto-approval at submission when a request
fits) with the units the fleet has now, plus the slots N more GPUs give, and reads each request's start
from it. The unit is the seed's slot arithmetic (capacity.mig.tiers.capacity_plan): a whole GPU is one
slot, a time-sliced GPU its replicas, a MIG GPU the instances of the profile it holds. For each N the
answer is the mean and P90 wait (arrival to start; a request still waiting at the end counts its wait
so far) and the reserved utilisation (slot-hours held over slot-hours there), beside what was observed,
with the assumptions it rests on (ASSUMPTIONS). Read-only.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from capacity.choices import SpecKind, Tier
from capacity.mig import tiers
from capacity.mig.catalog import find_product
from capacity.mig.layout import validate_layout
from capacity.models import NodeCapacity
from pools import units
from pools.choices import RequestState
from pools.models import Allocation, GpuPool, PoolRequest
from pools.units import topology

from . import forecast

ASSUMPTIONS = (
    "Demand is stationary: the window's requests arrive again at the same times, with the same sizes.",
    "Hold times are those observed: a released pool's own hold; a pool still held, or a request never served, "
    "draws its hold from the hold history (scheduling.forecast.Survival, given how long it has held).",
    "A request with an end date releases at it; one whose end came while it waited leaves the queue then.",
    "Every request is approved when its units are free (an auto-approval policy for all of them): operator "
    "decision time, holds and moves are not replayed.",
    "The queue serves requests of the spec in arrival order; fair share and ageing (queue_order) are not "
    "replayed, nor borrowing of idle units.",
    "Added GPUs come as new nodes of the fleet's usual size, with the tier's slots per GPU, all healthy.",
)
TIER_KINDS = {
    Tier.SLA_INFERENCE: SpecKind.MIG,
    Tier.STAGING: SpecKind.MIG,
    Tier.DEVELOPMENT: SpecKind.TIMESLICE,
    Tier.TRAINING: SpecKind.FULL,
}
DEFAULT_REPLICAS = 4  # the seed's time-slicing, "4x oversubscription"
DEFAULT_GPUS_PER_NODE = 8
DRAWS = 10  # replays per N; they differ only in the holds drawn from the history
BEFORE = dt.timedelta(microseconds=1)
NO_PLACE = 2**62  # the replay has no request of its own: a count no place holds runs each draw to the horizon


class WhatIfError(ValueError):
    """Input the what-if cannot answer: `errors` maps each parameter to its messages (a 400 in the API)."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(errors)
        self.errors = errors


@dataclass(frozen=True)
class Spec:
    """What the what-if is about: one product in one tier (and, for MIG, one profile), sized in slots."""

    product: str
    tier: str
    kind: str
    profile: str
    slots_per_gpu: int
    arithmetic: dict  # capacity_plan for one GPU: where slots_per_gpu comes from

    def slots(self, gpus: int) -> int:
        return gpus * self.slots_per_gpu

    def request(self) -> PoolRequest:
        """An unsaved request of the spec, for the unit and holder reads approval and the forecast make."""
        return PoolRequest(spec_kind=self.kind, product=self.product, tier=self.tier, profile_name=self.profile)

    def history_q(self) -> Q:
        q = Q(spec_kind=self.kind, product=self.product, tier__in=[self.tier, Tier.NONE])
        return q & Q(profile_name=self.profile) if self.kind == SpecKind.MIG else q


def spec_for(product: str, tier: str, profile: str = "") -> Spec:
    """The spec and its slots per GPU (the seed's arithmetic); WhatIfError naming the parameter to fix."""
    found = find_product(product)
    if found is None:
        raise WhatIfError({"product": [f"Unknown GPU product {product!r}: give a catalog key such as H100-80GB."]})
    if tier not in TIER_KINDS:
        raise WhatIfError({"tier": [f"Choose a tier among {', '.join(TIER_KINDS)}."]})
    kind = TIER_KINDS[tier]
    if kind == SpecKind.MIG:
        if not profile:
            raise WhatIfError({"profile": [f"Tier {tier} is MIG: name the profile, e.g. 3g.40gb."]})
        per_gpu = _most_instances(found, profile)
        if not per_gpu:
            raise WhatIfError({"profile": [f"{found.key} has no MIG profile {profile!r}."]})
        plan = tiers.capacity_plan(found, 1, layout=[profile] * per_gpu)["tiers"][tiers.TIER_MIG]
        return Spec(found.key, tier, kind, profile, plan["by_spec"][profile], plan)
    if profile:
        raise WhatIfError({"profile": [f"Tier {tier} hands out no MIG instances: leave the profile out."]})
    if kind == SpecKind.TIMESLICE:
        plan = tiers.capacity_plan(found, 1, timeslice_replicas=_replicas(found))["tiers"][tiers.TIER_TIMESLICE]
    else:
        plan = tiers.capacity_plan(found, 1)["tiers"][tiers.TIER_FULL]
    return Spec(found.key, tier, kind, "", plan["slots"], plan)


def _most_instances(product, profile: str) -> int:
    """How many instances of `profile` one GPU holds at most (0: the product has no such profile)."""
    k = 0
    while k < 8 and validate_layout(product, [profile] * (k + 1)).valid:
        k += 1
    return k


def _replicas(product) -> int:
    """The time-slicing of the tier's nodes now (the most common), else the seed's 4."""
    seen = Counter(
        NodeCapacity.objects.filter(tier=Tier.DEVELOPMENT, timeslice_replicas__gt=1)
        .filter(gpu_product__in=[product.gfd_product, product.key])
        .values_list("timeslice_replicas", flat=True)
        .iterator()
    )
    return seen.most_common(1)[0][0] if seen else DEFAULT_REPLICAS


def capacity_by_node(spec: Spec, now: dt.datetime) -> tuple[dict[int, int], bool]:
    """The spec's units now, held or free, by node (whole GPUs, which must fit on one node), else on one place
    (node 0): what approval counts (pools.units), as the forecast reads it."""
    request = spec.request()
    if spec.kind == SpecKind.FULL:
        return {n: k for n, (_, k) in topology.free_by_node(units.full_hosts(request)).items()}, True
    free = units.usable_free(request, units.free_by_cluster(request))
    held, _ = forecast.holders(request, now=now, history={})
    return {0: free + sum(h.units for h in held)}, False


def added_nodes(spec: Spec, gpus: int, capacity: dict[int, int], per_node: bool) -> dict[int, int]:
    """Units of `gpus` more GPUs, as new nodes of the fleet's usual GPU count (ids after the fleet's)."""
    if not gpus:
        return {}
    if not per_node:
        return {max(capacity, default=0) + 1: spec.slots(gpus)}
    size = Counter(capacity.values()).most_common(1)[0][0] if capacity else DEFAULT_GPUS_PER_NODE
    size = max(1, size // spec.slots_per_gpu)
    first = max(capacity, default=0) + 1
    return {first + i: spec.slots(min(size, gpus - i * size)) for i in range(math.ceil(gpus / size))}


@dataclass(frozen=True)
class Demand:
    """One request of the window, as the replay needs it."""

    request_id: int
    project_id: int
    workload: str
    count: int
    created: dt.datetime
    end_at: dt.datetime | None  # its declared end, or when it left the queue unserved
    approved: dt.datetime | None
    hold_h: float | None  # observed; None when still held (censored) or never served
    held_h: float  # a pool still held: how long so far


def demand(spec: Spec, *, since: dt.datetime, now: dt.datetime) -> list[Demand]:
    """The spec's requests created in [since, now) that were approved or queued, oldest first."""
    rows = (
        PoolRequest.objects.filter(spec.history_q(), created_at__gte=since, created_at__lt=now)
        .filter(Q(approved_at__isnull=False) | Q(queue_entry__isnull=False))
        .order_by("created_at", "pk")
        .values_list(
            "pk", "project_id", "workload_type", "count", "created_at", "end_at", "approved_at", "state", "updated_at"
        )
    )
    released = dict(
        GpuPool.objects.filter(request__in=[r[0] for r in rows], released_at__isnull=False).values_list(
            "request_id", "released_at"
        )
    )
    out = []
    for pk, project, workload, count, created, end_at, approved, state, updated in rows:
        hold = held = None
        if approved is not None and pk in released:
            hold = _hours(approved, released[pk])
        elif approved is not None:
            held = _hours(approved, now)
        elif state not in (RequestState.QUEUED, RequestState.SUBMITTED) and updated < now:
            end_at = min(end_at, updated) if end_at else updated  # withdrawn or refused while waiting
        out.append(Demand(pk, project, workload, count, created, end_at, approved, hold, held or 0.0))
    return out


def _hours(a: dt.datetime, b: dt.datetime) -> float:
    return max(0.0, (b - a).total_seconds() / 3600)


def _nearest_rank(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def observed(rows: list[Demand], *, since: dt.datetime, now: dt.datetime, slots: int) -> dict:
    """What happened: waits (approval, or still waiting at `now`) and reserved utilisation of the window."""
    waits, busy = [], 0.0
    for row in rows:
        if row.approved is not None:
            waits.append(_hours(row.created, row.approved))
            end = row.approved + dt.timedelta(hours=row.hold_h if row.hold_h is not None else row.held_h)
            busy += row.count * _hours(max(row.approved, since), min(end, now))
        elif row.end_at is None or row.end_at > now:
            waits.append(_hours(row.created, now))
    return _figures(waits, busy, slots * _hours(since, now), started=sum(r.approved is not None for r in rows))


def _figures(waits: list[float], busy: float, capacity_h: float, *, started: int) -> dict:
    return {
        "mean_wait_h": round(sum(waits) / len(waits), 3) if waits else 0.0,
        "p90_wait_h": round(_nearest_rank(waits, 0.9), 3),
        "utilisation": round(busy / capacity_h, 3) if capacity_h else None,
        "started": started,
        "still_waiting": len(waits) - started,
    }


@dataclass(frozen=True)
class Window:
    """What every replay of the window starts from: the fleet's units now, empty at `since` but for the pools
    that held units then (holders), and the requests waiting then (ahead); capacity by node."""

    since: dt.datetime
    now: dt.datetime
    capacity: dict[int, int]
    per_node: bool
    free: dict[int, int]
    holders: list[forecast.Holder]
    ahead: list[forecast.Waiting]
    history: dict

    def timeline(self, rows: list[Demand], rng: random.Random, extra: dict[int, int]) -> forecast.Timeline:
        """The window as one forecast timeline with `extra` units, the window's requests as known arrivals
        (their holds drawn with `rng` where none was observed: still held, at least as long as so far)."""
        times, samples = [], []
        for row in rows:
            hold = row.hold_h
            if hold is None and row.approved is not None:  # still held: at least as long as so far
                survival, _ = forecast.hold_samples(self.history, row.project_id, row.workload)
                hold = row.held_h + (
                    survival.remaining(row.held_h, rng)
                    if survival is not None  # else as the forecast's holder without history (_remaining_h)
                    else max(settings.QUEUE_FORECAST_DEFAULT_HOLD_H - row.held_h, settings.QUEUE_FORECAST_OVERDUE_H)
                )
            times.append(row.created)
            samples.append(
                forecast.Arrival(
                    row.count,
                    row.project_id,
                    row.workload,
                    ahead=True,
                    auto=True,
                    hold_h=hold,
                    request_id=row.request_id,
                    end_at=row.end_at,
                )
            )
        built = forecast.Timeline(
            now=self.since - BEFORE,  # an arrival at `since` comes after the timeline's start, as next_after asks
            horizon=self.now,
            count=NO_PLACE,
            units=forecast.Units(self.free, self.per_node),
            holders=self.holders,
            ahead=self.ahead,
            coming=forecast.KnownArrivals(times, samples),
            history=self.history,
        )
        return built.with_units(extra)


def window(spec: Spec, *, since: dt.datetime, now: dt.datetime, history: dict) -> Window:
    """Read what every replay of [since, now) starts from (Window)."""
    capacity, per_node = capacity_by_node(spec, now)
    free = dict(capacity)
    holders = []
    for pool_id, created, released, project, workload in (
        GpuPool.objects.filter(request__in=PoolRequest.objects.filter(spec.history_q()), created_at__lt=since)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=since))
        .values_list("pk", "created_at", "released_at", "project_id", "workload_type")
    ):
        nodes = _pool_nodes(pool_id, per_node)
        for node, k in nodes:
            free[node] = free.get(node, 0) - k
        survival, _ = forecast.hold_samples(history, project, workload)
        held = sum(k for _, k in nodes)
        holders.append(forecast.Holder(held, released, _hours(created, since), survival, nodes, pool_id, project))
    ahead = [
        forecast.Waiting(r.count, r.project_id, r.workload_type, r.end_at, r.pk)
        for r in PoolRequest.objects.filter(spec.history_q(), created_at__lt=since, queue_entry__isnull=False)
        .filter(Q(approved_at__isnull=True) | Q(approved_at__gte=since))
        .order_by("created_at", "pk")
    ]
    free = {n: max(0, k) for n, k in free.items()}
    return Window(since, now, capacity, per_node, free, holders, ahead, history)


def _pool_nodes(pool_id: int, per_node: bool) -> tuple[tuple[int, int], ...]:
    rows = Allocation.objects.filter(pool_id=pool_id).values("gpu__node_id").annotate(n=Count("pk"))
    if not per_node:
        return ((0, sum(r["n"] for r in rows)),)
    return tuple((r["gpu__node_id"], r["n"]) for r in rows.order_by("gpu__node_id"))


def replay(built: forecast.Timeline, rows: list[Demand], *, rng: random.Random, slots: int) -> dict:
    """One draw of `built` to its horizon: each request's start, hence waits and reserved slot-hours."""
    since, now = built.now + BEFORE, built.horizon
    starts: dict[int, dt.datetime] = {}
    busy = 0.0

    def started(item, t: dt.datetime, release: dt.datetime) -> None:
        nonlocal busy
        busy += item.count * _hours(max(t, since), min(release, now))
        if item.request_id is not None:
            starts.setdefault(item.request_id, t)

    built.draw(rng, started=started)
    for holder in built.holders:  # held since before the window: busy until their release, or the end
        busy += holder.units * _hours(since, min(holder.end_at or now, now))
    waits = []
    for row in rows:
        if row.request_id in starts:
            waits.append(_hours(row.created, starts[row.request_id]))
        elif row.end_at is None or row.end_at > now:
            waits.append(_hours(row.created, now))
    return _figures(waits, busy, slots * _hours(since, now), started=len(starts.keys() & {r.request_id for r in rows}))


def what_if(
    product: str,
    tier: str,
    add: list[int],
    *,
    profile: str = "",
    window_days: int = 30,
    now: dt.datetime | None = None,
    draws: int = DRAWS,
    seed: int | None = None,
) -> dict:
    """For each N in `add`: mean and P90 wait and utilisation had the spec had N more GPUs over the window."""
    spec = spec_for(product, tier, profile)
    if not add or any(n < 0 for n in add):
        raise WhatIfError({"add": ["Give one or more GPU counts, each 0 or more."]})
    now = now or timezone.now()
    since = now - dt.timedelta(days=window_days)
    seed = settings.QUEUE_FORECAST_SEED if seed is None else seed
    rows = demand(spec, since=since, now=now)
    start = window(spec, since=since, now=now, history=forecast.hold_history(now=now))
    slots_now = sum(start.capacity.values())
    answers = []
    for n in add:
        extra = added_nodes(spec, n, start.capacity, start.per_node)
        figures = [  # the same random numbers for every N: the answers differ by the GPUs alone
            replay(
                start.timeline(rows, random.Random(f"{seed}-holds-{d}"), extra),
                rows,
                rng=random.Random(f"{seed}-draw-{d}"),
                slots=slots_now + spec.slots(n),
            )
            for d in range(draws)
        ]
        answers.append(
            {"add_gpus": n, "add_slots": spec.slots(n), "slots": slots_now + spec.slots(n), **_mean_of(figures)}
        )
    return {
        "product": spec.product,
        "tier": spec.tier,
        "profile": spec.profile,
        "window": {"since": since, "until": now, "days": window_days},
        "unit": {"slots_per_gpu": spec.slots_per_gpu, "kind": spec.kind, "arithmetic": spec.arithmetic},
        "slots_now": slots_now,
        "requests": len(rows),
        "observed": observed(rows, since=since, now=now, slots=slots_now),
        "answers": answers,
        "draws": draws,
        "seed": seed,
        "assumptions": list(ASSUMPTIONS),
    }


def _mean_of(figures: list[dict]) -> dict:
    """The draws' figures averaged (counts rounded)."""
    out = {}
    for key in ("mean_wait_h", "p90_wait_h", "utilisation", "started", "still_waiting"):
        values = [f[key] for f in figures if f[key] is not None]
        mean = sum(values) / len(values) if values else None
        out[key] = None if mean is None else (round(mean) if key in ("started", "still_waiting") else round(mean, 3))
    return out
